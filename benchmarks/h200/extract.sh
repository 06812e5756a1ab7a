#!/bin/bash
# Stage hidden with SGLang's model runner in process, on the GPU machine after SGLang is staged (run.sh's header)
# calls (benchmarks/h200/run.sh's header; .whl is not needed here). Logs and JSON come back in $OUT.
#   bash benchmarks/h200/extract.sh tests   # GPU-marked tests: SGLang shards vs transformers shards,
#                                      # TP 2 vs TP 1 (runs on nvidia-h200-x2 only)
#   bash benchmarks/h200/extract.sh bench   # the SGLang mode of make bench-extract on one GPU:
#                                      # SmolLM2 (real weights) and a Llama-3.1-8B shape (random);
#                                      # a torch.profiler run of one SmolLM2 SGLang extraction
#                                      # goes to $OUT/profile (profile.txt, Chrome trace)
#   bash benchmarks/h200/extract.sh pyspy   # one SmolLM2 bench run under py-spy (every thread,
#                                      # idle included): $OUT/pyspy-smollm2.txt, collapsed
#                                      # stacks (needs py-spy from .whl in /tmp/site)
set -uo pipefail
source "$(dirname "$0")/env.sh"
[ -d /tmp/site/sglang ] || { echo "specbuild: /tmp/site has no sglang: stage SGLang first (run.sh's header)"; exit 2; }
T=results/target/smollm2-135m-instruct
if [ ! -f "$T/fingerprint.json" ]; then
  python3 -c "from specbuild.target import materialize_target as m; \
m(source='/tmp/smol', name='smollm2-135m-instruct', out_dir='$T')" || exit 1
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
case "${1:-tests}" in
  tests)
    SPECBUILD_TEST_TARGET=$PWD/$T timeout 540 python3 -m pytest -q -rs -s -m gpu \
      -p no:cacheprovider tests/unit/hidden/test_sglang.py tests/unit/hidden/test_hidden.py 2>&1 \
      | tee "$OUT/gpu-tests.log"
    ;;
  bench)
    timeout 270 python3 -m benchmarks.extract --engine sglang --target-dir "$T" \
      --samples 1024 --max-len 1024 --batch-tokens 32768 --repeats 3 --profile "$OUT/profile" \
      --out "$OUT/extract_sglang_smollm2.json" 2>&1 | tee "$OUT/bench-smollm2.log" | tail -12
    timeout 280 python3 -m benchmarks.extract --engine sglang --preset llama8b \
      --tokenizer-dir "$T" --samples 256 --max-len 1024 --batch-tokens 16384 --repeats 2 \
      --out "$OUT/extract_sglang_llama8b.json" 2>&1 | tee "$OUT/bench-llama8b.log" | tail -12
    ;;
  pyspy)
    [ -x /tmp/site/bin/py-spy ] || { echo "specbuild: no /tmp/site/bin/py-spy: install .whl"; exit 2; }
    timeout 200 /tmp/site/bin/py-spy record --idle --threads --format raw --rate 200 \
      --output "$OUT/pyspy-smollm2.txt" -- python3 -m benchmarks.extract --engine sglang \
      --target-dir "$T" --samples 1024 --max-len 1024 --batch-tokens 32768 --repeats 1 \
      --out "$OUT/extract_sglang_smollm2_pyspy.json" 2>&1 | tail -5
    ;;
  *) echo "usage: $0 tests|bench|pyspy"; exit 2 ;;
esac
