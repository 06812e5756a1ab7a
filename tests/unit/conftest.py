"""Shared by the unit tests: the embedded default config, filled with the schema's defaults as
the workflow fills it, and a keeper registry of the test's own."""

import copy
from pathlib import Path

import pytest
import yaml

from specbuild.config import check_config
from specbuild.engines.keepers import REGISTRY_ENV, stop_all

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def _filled_default() -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    check_config(config, schema=REPO / "config" / "config.schema.yaml", source="t", workdir=REPO)
    return config


@pytest.fixture
def default_config(_filled_default) -> dict:
    """A fresh copy of the schema-filled config/config.yaml: tests may change its keys."""
    return copy.deepcopy(_filled_default)


@pytest.fixture
def registry(tmp_path, monkeypatch) -> Path:
    """A keeper registry of the test's own, outside any SLURM job; no keeper outlives it."""
    root = tmp_path / "keepers"
    monkeypatch.setenv(REGISTRY_ENV, str(root))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    yield root
    stop_all()
