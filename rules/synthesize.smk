# Stage synthesize: the samples shards of a dataset without a file, whose user prompts the
# target writes itself (specbuild/synthesize.py); `samples` builds those of a file.


rule synthesize:
    """User prompts the target writes itself for one shard of a synthetic dataset."""
    input:
        fp=target_file("fingerprint.json"),
    output:
        samples="results/samples/{dataset}/{shard}.jsonl",
        rejected="results/samples/{dataset}/{shard}.rejected.jsonl",
        counts="results/samples/{dataset}/{shard}.counts.json",
    log:
        "logs/synthesize/{dataset}/{shard}.log",
    wildcard_constraints:
        dataset=datasets.datasets_regex(config, synthetic=True),
    # the head of the longest chain (PRIORITY in specbuild/workflow/scheduling.py)
    priority: PRIORITY["synthesize"]
    conda:
        engine_env(config["generate"]["backend"])
    # one torch thread: two spinning threads decoded 32 prompts 4x slower than one under
    # load 4 (1.3x faster with passive waits), so two shards side by side, a thread each
    # (BENCHMARKS.md, "CPU decoding")
    threads: 1
    resources:
        gpu=scheduling.generate_gpus(config),
        mem_mb=scheduling.stage_mem_mb(config, "synthesize"),
        runtime=60,
        engine_sharing=engine_settings.server_sharing(config),
    params:
        span=job(datasets.shard_range, config),
        backend=config["generate"]["backend"],
        backend_args=engine_settings.generate_backend_args(config),
        sampling=job(datasets.synthesize_sampling, config),
        batch_size=config["generate"]["batch_size"],
    script:
        "../scripts/synthesize.py"
