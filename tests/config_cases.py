"""Shared by the config tests: the repo's schema and default config, and the faults of a config
that `check_config` refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specbuild.config import ConfigError, check_config

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "config" / "config.schema.yaml"


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def default_config() -> dict:
    """A fresh copy of config/config.yaml, as the user wrote it (no defaults filled)."""
    return load_yaml(REPO / "config" / "config.yaml")


def faults(config: dict, workdir: Path = REPO) -> list[str]:
    """The fault lines of a config `check_config` must refuse (the test fails if it passes)."""
    with pytest.raises(ConfigError) as err:
        check_config(config, schema=SCHEMA, source="test.yaml", workdir=workdir)
    assert str(err.value).startswith("test.yaml: ")
    return err.value.faults


def passes(config: dict, workdir: Path = REPO) -> dict:
    """`config` with its defaults filled, after `check_config` accepted it."""
    check_config(config, schema=SCHEMA, source="test.yaml", workdir=workdir)
    return config
