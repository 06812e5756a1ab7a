#!/bin/bash
# Host memory of the engine-bound jobs on one GPU (benchmarks/host_memory.py): the hidden stage's
# SGLang model runner and the generate stage's SGLang server, each loading SmolLM2 (/tmp/smol,
# staged by .ship3/model.sh) and a random-weight DeepSeek-V3 target at two sizes
# (benchmarks/h200/random_deepseek.py: its test widths, 8 layers of 8 experts; and Kimi-K2.5's
# widths, 4 layers of 32 experts). Rows go to $OUT/host_memory.jsonl. Each engine bounds its KV
# pool as the GPU tests' do, so it may run beside them:
#   bash benchmarks/h200/host_memory.sh & bash benchmarks/h200/gpu_tests.sh -k "deepseek or kimi"; wait
set -uo pipefail
source "$(dirname "$0")/env.sh"
T=/tmp/specbuild-test-target
[ -f "$T/fingerprint.json" ] || python3 -c "from specbuild.target import materialize_target as m
m(source='/tmp/smol', name='smollm2-135m-instruct', out_dir='$T')"
for size in small kimi4; do
  if [ ! -f "/tmp/hm-$size/target/fingerprint.json" ]; then
    if [ "$size" = small ]; then
      python3 -c "import sys; sys.path.insert(0, 'benchmarks/h200'); import random_deepseek as r
r.write_target(__import__('pathlib').Path('/tmp/hm-small/src'), __import__('pathlib').Path('$T'), **r.TEST_WIDTHS)"
    else
      python3 benchmarks/h200/random_deepseek.py /tmp/hm-kimi4/src --tokenizer "$T" --layers 4 --experts 32
    fi
    python3 -c "from specbuild.target import materialize_target as m
m(source='/tmp/hm-$size/src', name='deepseek-v3-$size', out_dir='/tmp/hm-$size/target')"
  fi
done
ARGS='"attention_backend": "triton", "sampling_backend": "pytorch", "max_total_tokens": 65536'
for target in "$T" /tmp/hm-small/target /tmp/hm-kimi4/target; do
  timeout 240 python3 -m benchmarks.host_memory "$target" --engine runner \
    --options "{\"server_args\": {$ARGS}, \"mem_fraction_static\": 0.85}" --out "$OUT/host_memory.jsonl" \
    >>"$OUT/host_memory.log" 2>&1 || echo "runner $target failed" >>"$OUT/host_memory.log"
  timeout 240 python3 -m benchmarks.host_memory "$target" --engine server \
    --options "{\"server_args\": {$ARGS, \"mem_fraction_static\": 0.85}}" --out "$OUT/host_memory.jsonl" \
    >>"$OUT/host_memory.log" 2>&1 || echo "server $target failed" >>"$OUT/host_memory.log"
done
cat "$OUT/host_memory.jsonl"
