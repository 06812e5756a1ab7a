#!/bin/bash
# An arm beside benchmarks/h200/run.sh's run, on that run's data: the same samples and generated
# shards, keys changed that the data does not depend on (hidden.storage, training keys), in a
# copy of the tree of its own so that the two runs' results never mix. Both runs' GPU jobs
# take slots of the same GPUs (specbuild.engines.gpus locks are per host), so the arm fills the GPU
# time the main run leaves idle.
#
#   SPECBUILD_SET="<the main run's keys> hidden.storage=fp8 train.epochs=4 bench.baseline=false" \
#     bash benchmarks/h200/arm.sh fp8            # fp8 shards against the main run's bf16
#
# Call it once the main run's generate jobs are done (its data is copied at the first call;
# a shard missing then is built by the arm itself). Every call waits on the arm at most
# SPECBUILD_BUDGET_S seconds (default 5: start it, then go on waiting on the main run) and
# packs the arm's tables, logs and report into $OUT/arm-<name>/.
set -uo pipefail
cd "$(dirname "$0")/../.."
NAME=${1:?usage: arm.sh NAME [snakemake args]}
shift
DIR=/tmp/specbuild-arm-$NAME
if [ ! -d "$DIR" ]; then
  [ -d results/generated ] || { echo "arm $NAME: the main run has no results/generated yet"; exit 2; }
  PYTHONPATH=$PWD/src python3 -m specbuild.seed pack "$DIR.seed.tar.gz" || exit 1
  mkdir -p "$DIR.tmp" &&
    tar -cf - --exclude=./results --exclude=./logs --exclude=./.snakemake --exclude='./.ship*' \
      --exclude=./.seed --exclude=./.git . | tar -xf - -C "$DIR.tmp" && mv "$DIR.tmp" "$DIR" || exit 1
fi
cd "$DIR"
# no variants: the arm is one drafter, the recipe with SPECBUILD_SET's keys
ARM_OUT=${OUT:-/tmp/specbuild-out}/arm-$NAME
SPECBUILD_RUN_DIR=/tmp/specbuild-run-$NAME SPECBUILD_SEED=$DIR.seed.tar.gz SPECBUILD_VARIANTS= \
  SPECBUILD_BUDGET_S=${SPECBUILD_BUDGET_S:-5} OUT=$ARM_OUT \
  bash benchmarks/h200/run.sh "$@"
rc=$?
rm -f "$ARM_OUT/specbuild-data.tar.gz"  # the main run's data: it comes back from there
exit $rc
