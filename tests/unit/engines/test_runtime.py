"""Memory settings of an in-process SGLang engine travel outside a job's params."""

from specbuild.engines.runtime import with_memory, without_memory


def test_server_flags_in_params_go_without_the_memory_ones():
    args = {"mem_fraction_static": 0.8, "attention_backend": "triton"}
    assert without_memory(args) == {"attention_backend": "triton"}
    assert args["mem_fraction_static"] == 0.8  # the config itself is left alone


def test_the_jobs_resource_is_put_back_and_hf_gets_nothing():
    options = {"server_args": {"attention_backend": "triton"}}
    assert with_memory(options, "0.35") == {**options, "mem_fraction_static": 0.35}
    assert with_memory({}, "") == {}
