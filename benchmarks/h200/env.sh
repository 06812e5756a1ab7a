# Sourced by the device scripts here: repo root, $OUT, the staged SGLang bundle's site-packages, and NVLink
# multicast off (shared hosts; device notes). Servers and ranks inherit this environment.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/specbuild-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
