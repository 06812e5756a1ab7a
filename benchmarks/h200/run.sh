#!/bin/bash
# specbuild on one offline H200 with an SGLang 0.5.17 install staged from ../shared/tools/sglang-device.
#
# Here, once (about 3 minutes, ~1.5 GB scratch; both folders are in .git/info/exclude):
#   bash ../shared/tools/sglang-device/prepare_local.sh $PWD/.sgl
#   rm -rf .ship1 .ship2 .ship3 && for i in 1 2 3; do cp -r .sgl/ship$i .ship$i; done
#   bash benchmarks/h200/wheels.sh            # snakemake + its pure-python deps -> .whl (~7 MB)
# On the device, one machine, each call right after the last (the machine stays warm
# 30 s and /tmp must survive):
#   carry [.ship1]: bash .ship1/stage.sh .ship1
#   carry [.ship2]: bash .ship2/stage.sh .ship2 && bash .ship2/setup_site.sh
#   carry [.ship3]: bash .ship3/stage.sh .ship3 && bash .ship3/model.sh /tmp/smol
#   carry [.whl]:   bash benchmarks/h200/run.sh   (.ship3 and .whl with the tree: over 64 MiB)
#   no carry:       bash benchmarks/h200/run.sh          (repeat until it prints "specbuild: done")
# The first call starts snakemake in its own process session (setsid: it outlives the call
# and runs on until the machine goes back) and waits for it at most SPECBUILD_BUDGET_S seconds
# (the device's limit is 600 s per command); each later call waits on the same run, so no job
# is stopped at a call's end. A call after the run ended starts a new one (a no-op when nothing
# changed; with more variants named, only theirs). Extra arguments go to
# snakemake (targets such as `align`, `report_bench`, `report_tuning`, `variants`,
# `results/bench/sglang/base/3-1-4.jsonl` (engine/drafter/chain; the baseline is
# none/baseline.jsonl), or flags); a run of every target (no extra arguments) that finishes
# also writes results/report.html (every table and plot of the example, the variants table
# among them).
# Every GPU of the machine is a schedulable resource; each GPU job pins its own device ids
# (specbuild.engines.gpus), so on nvidia-h200-x2 two servers run side by side. SPECBUILD_TRAIN_NPROC=2
# trains with torchrun on both GPUs (the config's train.nproc, overridden in a derived copy;
# every variant inherits it): with several variants leave it unset, so two train at once.
# SPECBUILD_VARIANTS="fc_norm ttt7" builds only those variants (and base), and only the
# datasets they train on; SPECBUILD_VARIANTS=base builds the recipe alone.
# SPECBUILD_SET="sglang.tuning.enabled=false bench.sweep_drafters=[]"
# sets config keys (dotted path = a YAML value, no spaces in either) in the derived copy.
# SPECBUILD_PRIORITY="base fc_norm": the variants whose drafters are built first (default none:
# it overrides the workflow's stage order, so engines restart between stages).
# SPECBUILD_GPU_SLOTS=N lets N jobs share each GPU (specbuild.engines.gpus): at SmolLM2 a server start
# or a single-stream bench leaves most of an H200 idle; a training takes a majority of a GPU's
# slots, so never two share one (three sharing one ran at ~0.75x one alone, BENCHMARKS.md) and,
# with N >= 3, a bench may run beside it; served tok/s of jobs that shared a GPU are shared-GPU
# figures (acceptance is unaffected).
# The workflow's synthesize and generate jobs share one server by themselves
# (sglang.share_idle_s, docs/DESIGN.md), started by the first and stopped when idle or claimed,
# and the hidden jobs one model runner (hidden.share_idle_s): one start of each for the
# example's data and hidden stages (BENCHMARKS.md, "SmolLM2 example on H200").
# A run's data goes on to the next: $OUT/specbuild-data.tar.gz holds every built samples
# and generated shard with their counts and rejects checks (the GPU half of the data stage, ~10
# GPU-minutes on one H200, BENCHMARKS.md). Keep it (git-ignored .seed/data.tar.gz) and carry
# it in a call of its own after the second staging call (the third is near the 64 MiB a call carries):
#   carry [.seed]: cp .seed/data.tar.gz /tmp/seed.tar.gz
# then start the run with SPECBUILD_SEED=/tmp/seed.tar.gz: it builds the target, unpacks the
# shards and marks them up to date on it (snakemake --touch: the target job is new, so each
# shard would be stale by its time stamp alone), then builds the rest; a shard the seed lacks is
# built as usual (specbuild/seed.py; it refuses a results/ that already has the seed's shards).
# The recipe from a seed of its data (benchmarks/h200/seed/README.md): from the seed of the first
# shards the whole run took 20 min 2 s of one H200 (data 8 min 4 s, training 7 min 16 s;
# BENCHMARKS.md, "SmolLM2 example on H200"); from the recipe's own seed the data is all there.
# Each variant adds ~7 min of training; name a subset with SPECBUILD_VARIANTS:
#   SPECBUILD_VARIANTS=base SPECBUILD_SEED=/tmp/seed.tar.gz SPECBUILD_GPU_SLOTS=3 \
#     SPECBUILD_SET="sglang.tuning.enabled=false bench.baseline=false" bash benchmarks/h200/run.sh
# SPECBUILD_REFERENCE=benchmarks/h200/rows/<file>.jsonl: summary.md also pairs every drafter's
# served rows with that reference's (benchmarks/paired.py; its README says which run each file
# is), so a lever run on the same card model need not train the reference again.
# Tables, plots and logs come back in $OUT: summary.md (the tables, and the model loads per stage
# of benchmarks/engine_loads.py), snakemake.log, specbuild-h200.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/../.."
CONFIG=${SPECBUILD_CONFIG:-config/examples/smollm2-sglang-h200.yaml}
# + start and packing (~30 s): under the device's 600 s a command. Call again at once: the
# machine goes back 30 s after a call ends, and the run with it.
BUDGET_S=${SPECBUILD_BUDGET_S:-540}
OUT=${OUT:-/tmp/specbuild-out}
RUN=${SPECBUILD_RUN_DIR:-/tmp/specbuild-run}  # the detached run's pid, log, config and exit status
mkdir -p "$OUT" "$RUN"
NPROC=${SPECBUILD_TRAIN_NPROC:-}
VARIANTS=${SPECBUILD_VARIANTS-all}
SET=${SPECBUILD_SET:-}
SLOTS=${SPECBUILD_GPU_SLOTS:-1}
if [ -n "$NPROC$SET" ] || [ "$VARIANTS" != all ]; then
  # a derived copy: train.nproc, only the named variants (base is always built) with the
  # datasets they train on, so a run that cannot fit every variant still ends with a report,
  # and the SPECBUILD_SET keys
  python3 - "$CONFIG" "$NPROC" "$VARIANTS" "$SET" "$RUN/config.yaml" <<'PY' || exit 1
import sys, yaml
config, nproc, variants, sets = sys.argv[1:5]
c = yaml.safe_load(open(config))
train = c["train"]
if nproc:
    train["nproc"] = int(nproc)
if variants != "all":
    keep = [v for v in variants.split() if v != "base"]  # base: the recipe, always built
    unknown = sorted(set(keep) - set(train.get("variants", {})))
    if unknown:
        sys.exit(f"SPECBUILD_VARIANTS names {unknown}, not in {config}'s train.variants")
    train["variants"] = {k: v for k, v in train.get("variants", {}).items() if k in keep}
    used = set(train.get("datasets", c["datasets"]))
    for v in train["variants"].values():
        used |= set(v.get("datasets", []))
    c["datasets"] = {k: v for k, v in c["datasets"].items() if k in used}
for item in sets.split():
    key, sep, value = item.partition("=")
    if not sep:
        sys.exit(f"SPECBUILD_SET: {item!r} is not key.path=value")
    *parents, leaf = key.split(".")
    node = c
    for k in parents:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            sys.exit(f"SPECBUILD_SET: {key}: {k} is not a mapping in {config}")
    node[leaf] = yaml.safe_load(value)
yaml.safe_dump(c, open(sys.argv[5], "w"), sort_keys=False)
PY
  CONFIG=$RUN/config.yaml
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
# NVLink multicast stays off on shared hosts (device notes); servers inherit this environment.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
GPUS=$(nvidia-smi -L | grep -c '^GPU ')
export SPECBUILD_GPU_SLOTS=$SLOTS

if [ "${SPECBUILD_RUN_CHILD:-}" = 1 ]; then
  echo $$ >"$RUN/pid"
  if [ -n "${SPECBUILD_SEED:-}" ] && [ ! -f "$RUN/seeded" ]; then
    # the last run's data: after the target (its new fingerprint would make every shard
    # stale), unpacked and touched in the DAG's order; Snakemake has no metadata for these
    # files, so neither params nor code changes rerun them, only a newer input. Only the
    # config's datasets: a derived config (SPECBUILD_VARIANTS) may train on fewer.
    datasets=$(python3 -c 'import sys, yaml; print(",".join(yaml.safe_load(open(sys.argv[1]))["datasets"]))' "$CONFIG") ||
      { echo "seed: no datasets read from $CONFIG" >>"$RUN/snakemake.log"; echo 1 >"$RUN/rc"; exit 1; }
    python3 -m specbuild.seed plant "$SPECBUILD_SEED" --datasets "$datasets" -- \
      python3 -m snakemake --configfile "$CONFIG" --cores 16 >>"$RUN/snakemake.log" 2>&1 ||
      { echo "seed $SPECBUILD_SEED failed" >>"$RUN/snakemake.log"; echo 1 >"$RUN/rc"; exit 1; }
    touch "$RUN/seeded"
  fi
  # the detached run itself: snakemake, then the report when it succeeded, then the status.
  # greedy scheduler: the ILP one needs pulp (16 MB of solver binaries) for no gain here.
  # SPECBUILD_PRIORITY: the variants whose drafters to build first (a run that may end early
  # keeps the recipe, not variants; on nvidia-h200-x2, 2026-11-30, a run out of GPU time had
  # trained two variants and never started base). Off by default: --prioritize lifts every
  # job those drafters need to one priority, so the workflow's stage order (every data job,
  # then the benches on generation's server, then hidden: PRIORITY in
  # specbuild/workflow/scheduling.py) is lost, and engines restart between stages (2026-12-05:
  # two data-server and two hidden-runner starts instead of one each).
  first=()
  for v in ${SPECBUILD_PRIORITY:-}; do first+=("results/drafter/$v/model.safetensors"); done
  [ ${#first[@]} -gt 0 ] && first=(--prioritize "${first[@]}")  # last: it takes every word after it
  python3 -m snakemake --configfile "$CONFIG" --cores 16 --resources gpu=$((GPUS * SLOTS)) \
    --scheduler greedy --rerun-incomplete --keep-going \
    "$@" "${first[@]}" >>"$RUN/snakemake.log" 2>&1
  rc=$?
  # the report lists every output of the workflow: after a run of some targets only, it
  # fails on the ones not built ("marked for report but does not exist")
  if [ "$rc" -eq 0 ] && [ $# -eq 0 ]; then
    python3 -m snakemake --configfile "$CONFIG" --report results/report.html >>"$RUN/snakemake.log" 2>&1
    rc=$?
  fi
  echo "$rc" >"$RUN/rc.tmp" && mv "$RUN/rc.tmp" "$RUN/rc"
  exit "$rc"
fi

[ -d /tmp/site/sglang ] || { echo "specbuild: /tmp/site has no sglang: run the three staging calls of this header first"; exit 2; }
[ -f /tmp/smol/config.json ] || { echo "specbuild: /tmp/smol missing: run .ship3/model.sh /tmp/smol"; exit 2; }
if [ ! -f /tmp/site/.specbuild-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.specbuild-wheels || exit 1
fi

alive() { [ -f "$RUN/pid" ] && kill -0 "$(cat "$RUN/pid")" 2>/dev/null; }
if alive; then
  echo "specbuild: waiting on the run started $(stat -c %y "$RUN/pid" | cut -d. -f1)"
else
  python3 -c "import snakemake, sglang, transformers, specbuild; print('snakemake', snakemake.__version__, 'sglang', sglang.__version__, 'transformers', transformers.__version__)" || exit 1
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
  rm -f "$RUN/rc"
  echo "=== $(date -u +%FT%TZ) run: $CONFIG $*" >>"$RUN/snakemake.log"
  SPECBUILD_RUN_CHILD=1 setsid nohup bash "$PWD/benchmarks/h200/run.sh" "$@" </dev/null >>"$RUN/child.log" 2>&1 &
  echo $! >"$RUN/pid"
  sleep 3  # the child writes its own pid (setsid may fork)
fi
start=$SECONDS
while alive && [ $((SECONDS - start)) -lt "$BUDGET_S" ]; do sleep 5; done
sleep 1

grep -E '^\[|^(local)?rule |wildcards:|^Finished|Error|error:|Exiting|specbuild' "$RUN/snakemake.log" | tail -60
{
  echo "# specbuild on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%FT%TZ)"
  for t in results/tables/*.md; do [ -f "$t" ] && { echo; echo "## $t"; cat "$t"; }; done
  # model loads per stage (servers, shared engines, runners), from the job logs
  [ -d logs ] && { echo; echo "## model loads (python3 -m benchmarks.engine_loads logs)"; python3 -m benchmarks.engine_loads logs; }
  if [ -n "${SPECBUILD_REFERENCE:-}" ]; then
    served=$(ls results/bench/sglang/*/*.jsonl 2>/dev/null | grep -v '/none/')
    echo; echo "## paired with $SPECBUILD_REFERENCE (python3 -m benchmarks.paired)"
    [ -n "$served" ] && python3 -m benchmarks.paired --across-chains "$SPECBUILD_REFERENCE" $served
  fi
} >"$OUT/summary.md"
cp "$RUN/snakemake.log" "$OUT/snakemake.log"
# results/train without checkpoints: each variant's metrics.jsonl and TensorBoard curves
# (*.tmp: a file being written as the call ends, e.g. a 2 GB checkpoint: out, or the tar grows
# past what a call brings back and outlasts the call)
# The kept engines' logs (their servers' output) too, never their spec.json (an API key)
tar -czf "$OUT/specbuild-h200.tar.gz" --exclude='*.safetensors' --exclude='*.tmp' \
  --exclude='results/train/*/state' \
  logs results/tables results/plots results/align results/tuning results/generated results/bench \
  results/train results/report.html $(find .specbuild/keepers -name keeper.log 2>/dev/null) 2>/dev/null
# the data seed for the next run (SPECBUILD_SEED above): the shards, counts, rejects, checks
[ -d results/generated ] && python3 -m specbuild.seed pack "$OUT/specbuild-data.tar.gz" >/dev/null
if alive; then
  echo "specbuild: still running after ${BUDGET_S}s: call again to wait on it"
  exit 124
fi
rc=$(cat "$RUN/rc" 2>/dev/null || echo 1)
if [ "$rc" -eq 0 ]; then echo "specbuild: done"; else echo "specbuild: rc=$rc (see snakemake.log)"; fi
exit "$rc"
