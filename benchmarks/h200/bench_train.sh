#!/bin/bash
# Stage train's speed on the device: `make bench-train PRESET=llama8b` without make (the device
# has python3 with torch and transformers, no network, no .venv). The drafter at Llama-3.1-8B
# shapes (hidden 4096, draft vocab 32,000, 7 TTT steps, samples of 2,048 tokens, 8,192 tokens a
# rank a step) on synthetic shards: tokens/s, TFLOP/s and MFU (drafter/flops.py says what is
# counted), then where a step's time goes (benchmarks/train_profile.py). Needs no SGLang install.
#   bash benchmarks/h200/bench_train.sh                  # tests, bench, profile, bench2 if 2 GPUs
#   bash benchmarks/h200/bench_train.sh bench profile    # any of: tests bench profile bench2
# tests:   the GPU-marked tests of stage train (CUDA path: fused AdamW, pinned batches loaded
#          ahead, kernel-time profile, the compiled fused TTT attention against the reference
#          and its graph count), ~3-4 min (compiles)
# Attention: train.attention auto = the fused FlexAttention kernel on CUDA, compiled by the
# first step of each run (estimated 30-90 s on a fresh machine, less once Inductor's on-disk
# cache holds it: profile and bench2 reuse bench's; inside the 5 warm-up steps, and eval's
# forward-only graph compiles in eval time, outside the windows). SPECBUILD_BENCH_ATTENTION=
# reference runs the materialised-scores path instead (the before). TORCH_LOGS=recompiles
# puts every recompile, with its reason, in bench_train.log; result-*.json's steady
# "compiled" counts graphs compiled in the measured windows (0 expected).
# bench:   1 GPU, 3 epochs of 15 steps (57 training samples; the first 5 steps are warm-up)
# profile: 1 GPU, 1 epoch, torch.profiler over steps 4-6 (the workspace of `bench` reused)
# bench2:  torchrun on 2 GPUs, 3 epochs of 7 steps a rank; its tokens/s over bench's
# Each step is capped at 240 s; generating the 4.3 GB of shards (the first bench step on a
# fresh machine) is about a minute of it; all four should fit one call of the 10-minute limit
# (estimated, not yet run). Back in $OUT: result-{1,2}gpu.json, profile.{json,txt},
# profile.trace.json.gz (ui.perfetto.dev), bench_train.log, summary.md (BENCHMARKS.md rows).
set -uo pipefail
source "$(dirname "$0")/env.sh"
W=results/perf/train
PRESET=${SPECBUILD_BENCH_PRESET:-llama8b}  # tiny: try this script on a CPU (fake nvidia-smi)
ATTENTION=${SPECBUILD_BENCH_ATTENTION:-auto}  # auto (flex on CUDA) | reference | flex
LOSS=${SPECBUILD_BENCH_LOSS:-auto}  # train.loss: auto (fused on CUDA) | reference | fused
# tokens a rank a step: 8,192 at llama8b; the SmolLM2 example trains on 16,384
# (SPECBUILD_BENCH_PRESET=smollm2 SPECBUILD_BENCH_TOKENS=16384: that drafter's shapes;
# SPECBUILD_BENCH_PRESET=kimi SPECBUILD_BENCH_TOKENS=16384: Kimi-K2.5's widths, 4K sequences,
# ~7.5 GB of shards)
TOKENS=${SPECBUILD_BENCH_TOKENS:-8192}
export TORCH_LOGS=${TORCH_LOGS:-recompiles}
LOG="$OUT/bench_train.log"
GPUS=$(nvidia-smi -L | grep -c '^GPU ')
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee -a "$LOG"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$LOG"
[ $# -eq 0 ] && set -- tests bench profile bench2

workspace() {  # $1: nproc, then synthetic's flags; the shards are written once per machine
  local nproc=$1; shift
  set -- --preset "$PRESET" --nproc "$nproc" --attention "$ATTENTION" --loss "$LOSS" --token-budget "$TOKENS" "$@"
  python3 -m benchmarks.synthetic "$W" --spec-only "$@" 2>/dev/null \
    || python3 -m benchmarks.synthetic "$W" "$@"
}

train() {  # $1: nproc
  timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node "$1" \
    -m benchmarks.train_speed "$W/spec.json" 2>&1 | tee -a "$LOG" | grep -E "tokens/s|rror"
}

rc=0
for step in "$@"; do
  echo "== $step" | tee -a "$LOG"
  case "$step" in
    tests)
      timeout 480 python3 -m pytest -q -m gpu -p no:cacheprovider tests/unit/drafter/test_train.py \
        tests/benchmarks/test_train_speed.py tests/unit/drafter/test_fused_attention.py 2>&1 | tee -a "$LOG" \
        | tail -5 || rc=1
      ;;
    bench)
      workspace 1 --epochs 3 && train 1 && cp "$W/result.json" "$OUT/result-1gpu.json" || rc=1
      ;;
    profile)
      workspace 1 --epochs 1 --profile && train 1 \
        && cp "$W"/profile.json "$W"/profile.txt "$W"/profile.trace.json.gz "$OUT/" || rc=1
      ;;
    bench2)
      if [ "$GPUS" -lt 2 ]; then echo "bench2: $GPUS GPU(s) visible, skipped" | tee -a "$LOG"; continue; fi
      workspace 2 --epochs 3 && train 2 && cp "$W/result.json" "$OUT/result-2gpu.json" || rc=1
      ;;
    *) echo "usage: $0 [tests] [bench] [profile] [bench2]"; exit 2 ;;
  esac
done

python3 - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, sys
from pathlib import Path
from benchmarks.train_speed import benchmarks_row
out = Path(sys.argv[1])
runs = {n: json.loads((out / f"result-{n}gpu.json").read_text())
        for n in (1, 2) if (out / f"result-{n}gpu.json").exists()}
print("| shape | device | steady steps | tokens/s | TFLOP/s | MFU |\n|---|---|---|---|---|---|")
for r in runs.values():
    print(benchmarks_row(r))
for n, r in runs.items():
    print(f"\n{n} GPU(s): attention {r.get('attention')}, loss {r.get('loss')}, torch {r.get('torch')}; graphs compiled "
          f"in the steady windows: {r['steady'].get('compiled')} (all steps: "
          f"{r['all_steps'].get('compiled')})")
if len(runs) == 2:
    one, two = (runs[n]["steady"]["tokens_per_s"] for n in (1, 2))
    print(f"\n2 GPUs / 1 GPU: {two / one:.2f}x tokens/s")
if (out / "profile.txt").exists():
    lines = (out / "profile.txt").read_text().splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("total"))
    print("\n```\n" + "\n".join(lines[: end + 1]) + "\n```")
EOF
exit "$rc"
