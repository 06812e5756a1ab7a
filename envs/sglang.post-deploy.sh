#!/usr/bin/env bash
# Snakemake runs this once after creating envs/sglang.yaml: specbuild from this checkout
# (its dependencies are pinned in the environment file).
set -euo pipefail
pip install --no-deps -e "$(cd "$(dirname "$0")/.." && pwd)"
