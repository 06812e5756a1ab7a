"""The one map from a config's dtype names to torch dtypes: every name the schema allows has
its torch dtype, and any other name is refused naming the choices."""

from __future__ import annotations

import pytest
import torch
import yaml
from config_cases import SCHEMA

from specbuild.infra.dtypes import DTYPES, torch_dtype


def _dtype_enums(node, path=()):
    """Every `...dtype` key of the schema with its allowed names, by dotted key."""
    if isinstance(node, dict):
        for key, value in node.items():
            if str(key).endswith("dtype") and isinstance(value, dict) and "enum" in value:
                yield ".".join((*path, key)), value["enum"]
            yield from _dtype_enums(value, (*path, str(key)))


def test_every_dtype_name_the_schema_allows_maps_to_that_torch_dtype():
    enums = dict(_dtype_enums(yaml.safe_load(SCHEMA.read_text())))
    assert "properties.target.properties.save_dtype" in enums
    assert "properties.export.properties.dtype" in enums
    for key, names in enums.items():
        assert set(names) <= set(DTYPES), key
        for name in names:
            assert torch_dtype(name) is getattr(torch, name), (key, name)


def test_an_unknown_dtype_name_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"unknown dtype 'fp8'; choose one of \['bfloat16', "):
        torch_dtype("fp8")
