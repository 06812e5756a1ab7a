import pytest

from specbuild.backends import BACKENDS, make_backend
from specbuild.engines.registry import lazy_class
from specbuild.hidden.extract import BACKENDS as FEATURE_BACKENDS


def test_a_name_outside_the_table_is_refused_with_its_key_and_the_choices():
    choices = r"hidden.backend 'vllm': choose one of \['hf', 'sglang'\]"
    with pytest.raises(ValueError, match=choices):
        lazy_class(FEATURE_BACKENDS, "vllm", key="hidden.backend")
    with pytest.raises(ValueError, match="backend 'nope'"):
        make_backend("nope")


def test_a_module_that_is_not_installed_says_so():
    with pytest.raises(RuntimeError, match="engine 'x' is not available here"):
        lazy_class({"x": "specbuild_no_such_module:Engine"}, "x", key="engine")


def test_every_entry_names_a_class():
    for table in (BACKENDS, FEATURE_BACKENDS):
        for name in table:
            assert isinstance(lazy_class(table, name, key="k"), type)
