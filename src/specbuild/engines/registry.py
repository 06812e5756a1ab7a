"""Engines chosen by name from a table of "module:Class" paths, imported only when chosen, so a
CPU-only install never imports server or GPU code it does not use."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module

__all__ = ["lazy_class"]


def lazy_class(table: Mapping[str, str], name: str, *, key: str) -> type:
    """The class `table[name]` names; `key` (the config key that chose it) leads each error."""
    if name not in table:
        raise ValueError(f"{key} {name!r}: choose one of {sorted(table)}")
    module_name, cls_name = table[name].split(":")
    try:
        module = import_module(module_name)
    except ModuleNotFoundError as err:
        raise RuntimeError(f"{key} {name!r} is not available here ({err}); install it") from err
    return getattr(module, cls_name)
