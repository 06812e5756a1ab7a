import os

from specbuild.workflow.scheduling import (
    bench_gpus,
    bench_threads,
    device_gpus,
    engine_env,
    generate_gpus,
    sglang_gpus,
    train_gpus,
)


def test_only_cuda_demands_a_gpu():
    assert [device_gpus(d) for d in ("cuda", "auto", "cpu")] == [1, 0, 0]


def test_a_sglang_server_takes_its_tensor_parallel_size(default_config):
    assert sglang_gpus(default_config) == 1
    default_config["sglang"]["server_args"] = {"tp": 4}
    assert sglang_gpus(default_config) == 4
    default_config["generate"]["backend"] = "sglang"
    assert generate_gpus(default_config) == 4
    assert bench_gpus(default_config, "sglang") == 4 and bench_gpus(default_config, "openai") == 0


def test_an_endpoints_gpus_are_not_scheduled(default_config):
    default_config["generate"]["backend"] = "openai"
    default_config["generate"]["device"] = "cuda"
    assert generate_gpus(default_config) == 0


def test_an_exclusive_hf_bench_claims_every_core_and_a_client_one(default_config):
    hf = default_config["bench"]["hf"]
    hf.update(workers=2, threads=1, exclusive=False)
    assert bench_threads(default_config, "hf") == 2
    hf["exclusive"] = True
    assert bench_threads(default_config, "hf") == max(2, os.cpu_count() or 1)
    assert bench_threads(default_config, "sglang") == 1


def test_train_on_cpu_asks_for_no_gpu_and_on_cuda_for_a_majority_per_process(monkeypatch):
    monkeypatch.setenv("SPECBUILD_GPU_SLOTS", "4")
    variants = {"base": {"nproc": 2, "device": "cuda"}, "cpu": {"nproc": 2, "device": "cpu"}}
    assert train_gpus(variants, "base") == 2 * 3 and train_gpus(variants, "cpu") == 0


def test_sglang_jobs_run_in_sglangs_env():
    assert engine_env("sglang") == "../envs/sglang.yaml"
    assert engine_env("hf") == "../envs/specbuild.yaml"


def test_a_hidden_job_counts_the_model_only_where_it_loads_one(default_config, monkeypatch):
    """Snakemake's own executor plugins: a local run's jobs hand their shards to the kept
    engine; a SLURM job loads its own (keepers.sharing_allowed), as does any job inside a
    SLURM allocation; a dry run shows the larger figure."""
    from types import SimpleNamespace

    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    from specbuild.workflow.scheduling import HIDDEN_CLIENT_MB, hidden_mem_mb, stage_mem_mb

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    registry = ExecutorPluginRegistry()

    def mem_mb(executor: str | None) -> int:
        plugin = registry.get_plugin(executor) if executor else None
        return hidden_mem_mb(default_config, SimpleNamespace(executor_plugin=plugin))({})

    own_mb = stage_mem_mb(default_config, "hidden")
    default_config["hidden"]["share_idle_s"] = 30
    assert mem_mb("local") == HIDDEN_CLIENT_MB < own_mb
    assert mem_mb("slurm") == mem_mb("dryrun") == mem_mb(None) == own_mb
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert mem_mb("local") == own_mb
    monkeypatch.delenv("SLURM_JOB_ID")
    default_config["hidden"]["share_idle_s"] = 0
    assert mem_mb("local") == own_mb


def test_an_sglang_engines_host_memory_follows_its_ranks_not_its_weights(default_config):
    from specbuild.workflow.scheduling import (
        JOB_FLOOR_MB,
        SGLANG_RANK_MB,
        SGLANG_RUNNER_MB,
        SGLANG_SERVER_MB,
        stage_mem_mb,
    )

    for section in ("generate", "hidden", "align"):
        default_config[section]["backend"] = "sglang"
    default_config["sglang"]["server_args"] = {"tp_size": 8}
    assert stage_mem_mb(default_config, "generate") == SGLANG_SERVER_MB + 7 * SGLANG_RANK_MB
    assert stage_mem_mb(default_config, "hidden") == SGLANG_RUNNER_MB + 7 * SGLANG_RANK_MB
    assert stage_mem_mb(default_config, "bench", "sglang") == stage_mem_mb(default_config, "tuning")
    assert stage_mem_mb(default_config, "bench", "openai") == JOB_FLOOR_MB["bench"]
    default_config["sglang"]["server_args"] = {}
    assert stage_mem_mb(default_config, "hidden") == max(SGLANG_RUNNER_MB, JOB_FLOOR_MB["hidden"])


def test_a_transformers_engine_holds_the_weights_mapped_and_in_its_compute_dtype(
    default_config, tmp_path, monkeypatch
):
    import json

    from specbuild.workflow.scheduling import JOB_FLOOR_MB, engine_host_mb, stage_mem_mb

    monkeypatch.chdir(tmp_path)  # no materialized target here: the source folder is read
    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    with open(source / "model.safetensors", "wb") as fh:  # 20 GiB, sparse
        fh.truncate(20 << 30)
    default_config["target"]["source"] = str(source)
    default_config["hidden"].update(backend="hf", dtype="float32")
    # 20 GiB mapped + 40 GiB of float32 + 1000 MB, with a quarter to spare
    want = int(1.25 * (1000 + 60 * 1024))
    assert engine_host_mb(default_config, "hf", "float32") == want
    assert stage_mem_mb(default_config, "hidden") == want
    default_config["hidden"]["dtype"] = "bfloat16"
    assert stage_mem_mb(default_config, "hidden") == int(1.25 * (1000 + 40 * 1024))
    default_config["target"]["source"] = "some-org/some-model"  # not on disk: the floor
    assert stage_mem_mb(default_config, "hidden") == JOB_FLOOR_MB["hidden"]
