"""Memory settings of an in-process SGLang engine travel outside a job's params."""

from specbuild.engines.runtime import Runtime, without_memory


def test_server_flags_in_params_go_without_the_memory_ones():
    args = {"mem_fraction_static": 0.8, "attention_backend": "triton"}
    assert without_memory(args) == {"attention_backend": "triton"}
    assert args["mem_fraction_static"] == 0.8  # the config itself is left alone


def test_the_jobs_resource_is_put_back_and_hf_gets_nothing():
    options = {"server_args": {"attention_backend": "triton"}}
    runtime = Runtime.from_resources(memory="0.35")
    assert runtime.with_memory(options) == {**options, "mem_fraction_static": 0.35}
    assert Runtime.from_resources(memory="").with_memory({}) == {}


def test_a_job_shares_only_when_given_idle_seconds_and_outside_slurm(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert Runtime.from_resources(sharing="30").shared
    assert not Runtime.from_resources(sharing="0").shared and not Runtime().shared
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert not Runtime(idle_s=30.0).shared
