#!/bin/bash
# Every GPU-marked test on one H200, after SGLang is staged (the first three calls in
# benchmarks/h200/run.sh's header), against the staged SmolLM2 (/tmp/smol, from
# .ship3/model.sh) materialized as the target stage does. The whole output goes to
# $OUT/gpu-tests.log (a failing test's captured stderr included), its tail to the console.
# Extra arguments go to pytest (`-k deepseek` runs the DeepSeek-V3 and Kimi-K2.5 layout tests).
# The whole set outlasts one 600 s device call (9 tests in 470 s on 2026-12-03, each SGLang
# start ~80 s): run it as two calls, `-k "deepseek or kimi"` and `-k "not deepseek and not kimi"`.
# It may share the GPU with a pipeline run (benchmarks/h200/run.sh) in the same calls, e.g.
#   bash benchmarks/h200/run.sh & bash benchmarks/h200/gpu_tests.sh -k "deepseek or kimi"; wait
# the tests' SGLang engines bound their KV pools (tests/conftest.py, sglang_test_options) and
# start one at a time with the run's (specbuild.engines.gpus.startup_lock); the run's figures are then
# shared-GPU figures.
set -uo pipefail
source "$(dirname "$0")/env.sh"
T=/tmp/specbuild-test-target
[ -f "$T/fingerprint.json" ] || python3 -c "from specbuild.target import materialize_target as m
m(source='/tmp/smol', name='smollm2-135m-instruct', out_dir='$T')"
files=$(grep -rl --include='*.py' "mark.gpu" tests/unit)
# SIGINT at the time limit: pytest then still reports the failures it has seen
SPECBUILD_TEST_TARGET=$T timeout -s INT -k 30 "${SPECBUILD_TIMEOUT_S:-540}" python3 -m pytest -v -rfEs -m gpu \
  -p no:cacheprovider "$@" $files >"$OUT/gpu-tests.log" 2>&1
rc=$?
tail -30 "$OUT/gpu-tests.log"
exit $rc
