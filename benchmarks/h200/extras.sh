#!/bin/bash
# After benchmarks/h200/run.sh printed "specbuild: done", on the same machine (nvidia-h200-x2):
# the GPU-marked tests and extraction tokens/s. Logs come back in $OUT. (Training on two GPUs
# is the pipeline's own train job: SPECBUILD_TRAIN_NPROC=2 bash benchmarks/h200/run.sh.)
set -uo pipefail
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader

cp logs/train/base.log "$OUT/train.log" 2>/dev/null
grep -h "tokens/s (" logs/train/base.log | tail -1

SPECBUILD_TEST_TARGET=$PWD/results/target/smollm2-135m-instruct \
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/unit/hidden/test_hidden.py \
  tests/unit/bench/test_hf.py tests/unit/drafter/test_train.py 2>&1 | tail -15 | tee "$OUT/gpu-tests.log"

timeout 120 python3 -m benchmarks.extract --device cuda --dtype bfloat16 --samples 256 \
  --max-len 1024 --batch-tokens 16384 --repeats 3 --out "$OUT/extract_gpu.json" 2>&1 | tail -8
