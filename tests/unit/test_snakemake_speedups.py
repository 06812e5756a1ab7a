"""The speedups skip only repeated work: Snakemake gets the same signature and the same parsed
source paths it would compute itself, and a marked function returns what it returned before."""

import inspect

import pytest
import snakemake.sourcecache as sourcecache
from snakemake.common import get_function_params, get_input_function_aux_params

from specbuild.snakemake_speedups import job_function, memoize_source_paths


def test_job_function_hands_snakemake_the_signature_so_it_never_inspects_again(monkeypatch):
    @job_function
    def span(wildcards, input):
        return [int(wildcards["shard"]) * 4, len(input)]

    def no_inspection(*args, **kwargs):
        raise AssertionError("Snakemake inspected a @job_function")

    monkeypatch.setattr(inspect, "signature", no_inspection)
    assert list(get_function_params(span)) == ["wildcards", "input"]
    aux = get_input_function_aux_params(span, {"input": ["a", "b"], "output": ["c"]})
    assert aux == {"input": ["a", "b"]}  # only what the function asks for, as before
    assert span({"shard": "00002"}, **aux) == [8, 2]


def test_job_function_returns_the_function_itself():
    def digest(wildcards):
        return "abc"

    assert job_function(digest) is digest


@pytest.fixture
def original_parse_uri(monkeypatch):
    """Snakemake's own parse, restored after the test (memoize_source_paths patches the module)."""
    original = sourcecache.parse_uri
    monkeypatch.setattr(sourcecache, "parse_uri", original)
    return original


@pytest.mark.parametrize(
    "path",
    ["../scripts/samples.py", "/work/repo/scripts/hidden.py", "file:///tmp/x.py", "https://h/x.py"],
)
def test_memoized_parse_gives_snakemake_the_same_source_path(original_parse_uri, path):
    expected = original_parse_uri(path)
    expected_cache_path = sourcecache.LocalSourceFile(path).get_cache_path()
    assert memoize_source_paths()
    assert sourcecache.parse_uri(path) == expected
    assert sourcecache.parse_uri(path) == expected  # the second call comes from the cache
    assert sourcecache.parse_uri.cache_info().hits >= 1
    assert sourcecache.LocalSourceFile(path).get_cache_path() == expected_cache_path


def test_memoizing_twice_wraps_snakemake_once(original_parse_uri):
    assert memoize_source_paths() and memoize_source_paths()
    assert sourcecache.parse_uri.__wrapped__ is original_parse_uri
