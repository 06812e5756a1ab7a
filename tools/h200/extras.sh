#!/bin/bash
# After tools/h200/run.sh printed "specbuild: done", on the same machine (nvidia-h200-x2):
# the GPU-marked tests, extraction tokens/s, and the default data's drafter trained again on
# two GPUs through torchrun (the pipeline's own train job used one). Logs come back in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
CONFIG=${SPECBUILD_CONFIG:-config/examples/smollm2-sglang-h200.yaml}
OUT=${OUT:-/tmp/specbuild-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name --format=csv,noheader

cp logs/train/train.log "$OUT/train-1gpu.log" 2>/dev/null
grep -h "tokens/s (" logs/train/train.log | tail -1

SPECBUILD_TEST_TARGET=$PWD/results/target/smollm2-135m-instruct \
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/unit/test_hidden.py \
  tests/unit/test_specdec.py tests/unit/test_train.py 2>&1 | tail -15 | tee "$OUT/gpu-tests.log"

timeout 120 python3 -m specbuild.bench.extract --device cuda --dtype bfloat16 --samples 256 \
  --max-len 1024 --batch-tokens 16384 --repeats 3 --out "$OUT/extract_gpu.json" 2>&1 | tail -8

# Same data and hyper-parameters, two DDP processes: only train.nproc differs. Targets come
# first: --resources and --forcerun take every word after them.
python3 -c "import yaml,sys; c=yaml.safe_load(open(sys.argv[1])); c['train']['nproc']=2; \
yaml.safe_dump(c, open('/tmp/specbuild-2gpu.yaml', 'w'), sort_keys=False)" "$CONFIG"
timeout 240 python3 -m snakemake results/train/best.safetensors \
  --configfile /tmp/specbuild-2gpu.yaml --cores 16 --scheduler greedy --resources gpu=2 \
  --forcerun train 2>&1 | tail -5
cp logs/train/train.log "$OUT/train-2gpu.log" 2>/dev/null
grep -h "tokens/s (" logs/train/train.log | tail -1
