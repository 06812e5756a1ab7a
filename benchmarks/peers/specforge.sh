#!/bin/bash
# specbuild's drafters beside SpecForge's (github.com/sgl-project/SpecForge, the SGLang project's
# EAGLE-3 trainer) on one GPU, in one run: the same conversations, the same epochs, batch size
# and learning rate, both drafters served by the same SGLang through specbuild's bench stage
# (bench.drafters: {specforge: ...}), same sets, same server flags. Writes $OUT/peers.md (the
# peers table: served acceptance per set with paired intervals, simulated acceptance, training
# wall time, tokens/s, GPU-minutes) beside run.sh's summary and tarball.
#
# usage, on the GPU host after run.sh's three staging calls (SGLang in /tmp/site, SmolLM2 in
# /tmp/smol), from the project root:
#   bash benchmarks/peers/specforge.sh [SPECFORGE_DIR]    again until it prints "peers: done"
#   SPECFORGE_DIR: SpecForge's offline EAGLE-3 bundle, whose run_specforge.sh drives SpecForge's
#        scripts/train_eagle3.py offline on one GPU (default: ../shared/tools/specforge-side,
#        else .specforge, a copy that travels with the tree). Without that bundle: install
#        SpecForge from its repository (github.com/sgl-project/SpecForge, README
#        "Installation") on a host with network, train with its scripts/train_eagle3.py on the
#        conversations that `python3 <bundle>/convert_seed.py SEED_DIR out.jsonl` writes, and
#        point bench.drafters at its output folder.
# Each call picks up where the last left off (state in $PEERS, default /tmp/peers):
#   1. the data seed (SEED, default .seed/variants-data.tar.gz; benchmarks/h200/seed/README.md)
#      unpacked for SpecForge, which starts detached at once (setsid: it outlives the call)
#      with the epochs and learning rate of `epochs_4` below and BATCH (16) conversations a step;
#   2. run.sh builds config/examples/smollm2-sglang-h200.yaml with benchmarks/peers/specforge.yaml
#      laid over it, from the same seed: the variants there, base included, benched at 3-1-4;
#   3. once both are done: SpecForge at its own defaults (batch 1, lr 1e-4) for DEFAULT_STEPS
#      (300) steps, to report its time to a drafter at the settings a new user gets;
#   4. run.sh again with bench.drafters.specforge: its benches and the report, nothing retrained;
#   5. benchmarks/peers/summary.py writes $OUT/peers.md.
# PEERS_BUDGET_S (540): seconds one call waits, under the device's 600 s a command.
# PEERS_SF_ONLY=1: step 1 alone (a staging call can start SpecForge as soon as /tmp/smol exists).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SF_DIR=${1:-}
if [ -z "$SF_DIR" ]; then
  for k in ../shared/tools/specforge-side .specforge; do [ -f "$k/run_specforge.sh" ] && { SF_DIR=$k; break; }; done
fi
[ -n "$SF_DIR" ] && [ -f "$SF_DIR/run_specforge.sh" ] || { echo "peers: no SpecForge bundle (run_specforge.sh) at '${SF_DIR:-?}': see this header"; exit 2; }
SF_DIR=$(cd "$SF_DIR" && pwd)
PEERS=${PEERS:-/tmp/peers}
SEED=$(realpath -m "${SEED:-.seed/variants-data.tar.gz}")
TARGET=${TARGET_DIR:-/tmp/smol}
BATCH=${BATCH:-16}
DEFAULT_STEPS=${DEFAULT_STEPS:-300}
BUDGET=${PEERS_BUDGET_S:-540}
OUT=${OUT:-/tmp/specbuild-out}
EXAMPLE=config/examples/smollm2-sglang-h200.yaml
OVERLAY=benchmarks/peers/specforge.yaml
mkdir -p "$PEERS" "$OUT"
export PYTHONPATH=/tmp/site:$ROOT/src PYTHONUNBUFFERED=1  # run_specforge.sh sets its own
T0=$SECONDS
left() { echo $((BUDGET - (SECONDS - T0))); }

# the merged config, and what SpecForge takes from it (epochs_4's epochs, the recipe's lr)
if [ ! -f "$PEERS/config.yaml" ]; then
  python3 -m benchmarks.peers.summary config "$EXAMPLE" "$OVERLAY" "$PEERS/config.yaml" || exit 1
fi
read -r EPOCHS LR VARIANTS < <(python3 -m benchmarks.peers.summary settings "$PEERS/config.yaml") || exit 1

# 1. the seed's conversations, and SpecForge on them
if [ ! -d "$PEERS/seed/results/generated" ]; then
  [ -f "$SEED" ] || { echo "peers: no data seed at $SEED (benchmarks/h200/seed/README.md)"; exit 2; }
  mkdir -p "$PEERS/seed" && tar -xzf "$SEED" -C "$PEERS/seed" || exit 1
fi
sf() {  # run_specforge.sh with the bundle's own site folders; returns at once (SF_WAIT_S=1)
  SF_WAIT_S=${SF_WAIT_S:-1} bash "$SF_DIR/run_specforge.sh" "$@" >>"$PEERS/specforge-calls.log" 2>&1
}
if [ ! -f "$PEERS/sf/started_at" ]; then
  [ -f "$TARGET/config.json" ] || { echo "peers: no target at $TARGET (the staging's model.sh)"; exit 2; }
  BATCH_SIZE=$BATCH LR=$LR sf "$PEERS/seed" "$TARGET" "$PEERS/sf" "$EPOCHS"
  rc=$?
  [ "$rc" = 75 ] || [ "$rc" = 0 ] || { tail -30 "$PEERS/specforge-calls.log"; echo "peers: SpecForge did not start (rc $rc)"; exit 1; }
  echo "peers: SpecForge started: $EPOCHS epochs, batch $BATCH, lr $LR ($PEERS/sf/train.log)"
fi
[ "${PEERS_SF_ONLY:-0}" = 1 ] && exit 0

# 2. ours, from the same seed (run.sh's detached run; each call waits on it)
run_ours() {  # $1: config; the rest to run.sh
  local config=$1; shift
  SPECBUILD_CONFIG=$config SPECBUILD_VARIANTS="$VARIANTS" SPECBUILD_SEED=$SEED \
    SPECBUILD_GPU_SLOTS=3 SPECBUILD_BUDGET_S=$(( $(left) > 20 ? $(left) - 20 : 1 )) \
    bash benchmarks/h200/run.sh "$@"
}
if [ ! -f "$PEERS/ours.done" ]; then
  run_ours "$PEERS/config.yaml"
  rc=$?
  [ "$rc" = 0 ] && touch "$PEERS/ours.done"
  [ "$rc" = 124 ] && { sf --wait "$PEERS/sf"; echo "peers: still running: call again"; exit 75; }
  [ "$rc" = 0 ] || { echo "peers: our run failed (rc $rc): $OUT/snakemake.log"; exit 1; }
fi

# SpecForge's drafter; then its defaults for a fixed number of steps (its time to a drafter)
SF_WAIT_S=$(( $(left) > 30 ? $(left) - 30 : 1 )) sf --wait "$PEERS/sf"
rc=$?
tail -3 "$PEERS/specforge-calls.log"
[ "$rc" = 75 ] && { echo "peers: SpecForge still training: call again"; exit 75; }
[ "$rc" = 0 ] || { echo "peers: SpecForge failed (rc $rc): $PEERS/sf/train.log"; exit 1; }
if [ ! -f "$PEERS/sf-defaults/started_at" ]; then
  MAX_STEPS=$DEFAULT_STEPS sf "$PEERS/seed" "$TARGET" "$PEERS/sf-defaults" "$EPOCHS"
fi

# 4. SpecForge's drafter through our bench stage, beside ours
if [ ! -f "$PEERS/bench.done" ]; then
  python3 -m benchmarks.peers.summary with-drafter "$PEERS/config.yaml" specforge "$PEERS/sf/drafter" \
    "$PEERS/config-peers.yaml" || exit 1
  rm -f /tmp/specbuild-run/rc  # run.sh's last run (ours) ended: this one starts afresh
  run_ours "$PEERS/config-peers.yaml"
  rc=$?
  [ "$rc" = 124 ] && { echo "peers: benches still running: call again"; exit 75; }
  [ "$rc" = 0 ] || { echo "peers: the peers bench failed (rc $rc): $OUT/snakemake.log"; exit 1; }
  touch "$PEERS/bench.done"
fi
SF_WAIT_S=$(( $(left) > 40 ? $(left) - 40 : 1 )) sf --wait "$PEERS/sf-defaults"
[ $? = 75 ] && { echo "peers: SpecForge's defaults run still going: call again"; exit 75; }

# 5. the table
python3 -m benchmarks.peers.summary table --results "$ROOT/results" --logs "$ROOT/logs" \
  --specforge "$PEERS/sf" --specforge-defaults "$PEERS/sf-defaults" \
  --config "$PEERS/config-peers.yaml" --device "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
  >"$OUT/peers.md" || exit 1
cat "$OUT/peers.md"
cp "$PEERS/sf/train.log" "$OUT/specforge-train.log" 2>/dev/null
echo "peers: done"
