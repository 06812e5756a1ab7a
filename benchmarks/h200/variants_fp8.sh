#!/bin/bash
# One H200 for the variants table and the served fp8 arm (BENCHMARKS.md): run.sh
# builds config/examples/smollm2-sglang-h200.yaml's every variant; as soon as the data the arm
# trains on is there, benchmarks/h200/arm.sh starts the arm beside it: the recipe at 4 epochs on fp8
# shards, against `epochs_4`, the same recipe on the main run's bf16 shards. Sized for one
# 30 minutes of the device (~1,800 device-s, staging included): one chat shard of 4,096
# prompts (not 20,480; training is the critical path, one at a time on the one GPU), tuning
# and the drafters' concurrency sweep off. One H200 built every variant from the seed in 17 min
# 44 s (BENCHMARKS.md, "SmolLM2 example on H200"), before `base_multiturn` (12 epochs on 6,745 samples, ~4,030
# steps: ~7-9 min more by `base`'s 1,524 steps in 3 min 23 s, estimated): with it every
# variant and the arm take more than 30 minutes; SPECBUILD_VARIANTS names the ones to build.
# The data comes from .seed/variants-data.tar.gz (git-ignored; benchmarks/h200/seed/README.md
# says how to restore it from git's history), built by this script's first run: without it the
# data stage took 9 min 9 s of that run (data server start, synthesize, generate).
# SPECBUILD_SEED= (empty) builds the data instead. The arm's tables and logs come back in
# $OUT/arm-fp8. The device's calls, each right after the last:
#   carry [.ship1]: bash .ship1/stage.sh .ship1
#   carry [.ship2]: bash .ship2/stage.sh .ship2 && bash .ship2/setup_site.sh
#   carry [.ship3]: bash .ship3/stage.sh .ship3 && bash .ship3/model.sh /tmp/smol
#   carry [.whl, .seed]: SPECBUILD_BUDGET_S=540 bash benchmarks/h200/variants_fp8.sh
#   no carry: SPECBUILD_BUDGET_S=<device budget left - 40> bash benchmarks/h200/variants_fp8.sh
#     again until it prints "specbuild: done" (a call the device stops returns no files).
# SPECBUILD_PAIR=1: the fp8 pair alone (BENCHMARKS.md, "hidden: fp8 against bf16"; the variants
# table: "SmolLM2 example: variants"): the main run is the recipe at 4 epochs with no variants (bf16 shards,
# `epochs_4`'s config), the arm the same on fp8 shards; both from the seed: 7 min 39 s from the
# first target job to the arm's last job on one H200 (2026-12-02).
set -uo pipefail
cd "$(dirname "$0")/../.."
COMMON="sglang.tuning.enabled=false bench.sweep_drafters=[] sglang.server_args.mem_fraction_static=0.2
datasets.chat.synthesize.count=4096 datasets.chat.shard_size=4096"
ARM_SET="$COMMON hidden.storage=fp8 train.epochs=4 bench.baseline=false"
export SPECBUILD_GPU_SLOTS=${SPECBUILD_GPU_SLOTS:-3}
BUDGET=${SPECBUILD_BUDGET_S:-540}
# the main run's drafters built first (in either order: prioritized jobs tie): the recipe and
# the arm's bf16 twin, so that a run cut short still has the fp8 pair (not exported:
# the arm has no variants)
FIRST=${SPECBUILD_PRIORITY:-base epochs_4}
MAIN_SET=$COMMON
if [ -n "${SPECBUILD_PAIR:-}" ]; then
  export SPECBUILD_VARIANTS=
  MAIN_SET="$COMMON train.epochs=4 bench.baseline=false"
  FIRST=base
fi
SEED=${SPECBUILD_SEED-.seed/variants-data.tar.gz}
ready() {  # the arm copies the main run's data: once unpacked and marked, or once generated
  if [ -n "$SEED" ]; then [ -f /tmp/specbuild-run/seeded ]; return; fi
  for f in gsm8k/00000 chat/00000; do [ -f "results/generated/$f.jsonl" ] || return 1; done
}
watch() {
  until [ -d /tmp/specbuild-arm-fp8 ]; do
    ready && SPECBUILD_SET="$ARM_SET" bash benchmarks/h200/arm.sh fp8 >>/tmp/specbuild-arm-start.log 2>&1
    sleep 5
  done
}
watch &
watcher=$!
SPECBUILD_SEED=$SEED SPECBUILD_SET="$MAIN_SET" SPECBUILD_PRIORITY="$FIRST" \
  SPECBUILD_BUDGET_S=$BUDGET bash benchmarks/h200/run.sh "$@"
rc=$?
kill "$watcher" 2>/dev/null
if [ -d /tmp/specbuild-arm-fp8 ]; then
  echo "=== arm fp8"
  # waits on the arm with what is left of this call's budget
  left=$((BUDGET - SECONDS))
  SPECBUILD_SET="$ARM_SET" SPECBUILD_BUDGET_S=$((left > 1 ? left : 1)) bash benchmarks/h200/arm.sh fp8 | tail -8
fi
exit $rc
