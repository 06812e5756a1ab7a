import pytest

from specbuild.backends import make_backend
from specbuild.engines.registry import TABLE, lazy_class, lazy_load


def test_a_name_outside_the_table_is_refused_with_its_key_and_the_choices():
    choices = r"hidden.backend 'vllm': choose one of \['hf', 'sglang'\]"
    with pytest.raises(ValueError, match=choices):
        lazy_class("hidden.backend", "vllm")
    with pytest.raises(ValueError, match="generate.backend 'nope'"):
        make_backend("nope")


def test_a_module_that_is_not_installed_says_so():
    with pytest.raises(RuntimeError, match="engine 'x' is not available here"):
        lazy_load("specbuild_no_such_module:Engine", what="engine 'x'")


def test_every_entry_names_something_that_exists():
    for key, table in TABLE.items():
        for name in table:
            assert callable(lazy_class(key, name)), (key, name)
