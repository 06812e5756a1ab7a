"""The embedded default config, filled with the schema's defaults as the workflow fills it."""

import copy
from pathlib import Path

import pytest
import yaml

from specbuild.config import check_config

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
