rule generate:
    """Regenerate the assistant turns of one samples shard with the target."""
    input:
        samples="results/samples/{dataset}/{shard}.jsonl",
        fp=target_file("fingerprint.json"),
        # the samples shard passed its rejected-row check (rules/rejects.smk)
        checked="results/checks/samples/{dataset}/{shard}.json",
        # prompts are checked against these for near-duplicates (none when that is off)
        earlier=job(earlier_samples, config, SHARDS),
    output:
        generated="results/generated/{dataset}/{shard}.jsonl",
        rejected="results/generated/{dataset}/{shard}.rejected.jsonl",
        counts="results/generated/{dataset}/{shard}.counts.json",
    log:
        "logs/generate/{dataset}/{shard}.log",
    # decoding first (PRIORITY in specbuild/workflow/scheduling.py)
    priority: PRIORITY["decode"]
    conda:
        engine_env(config["generate"]["backend"])
    # one torch thread: two spinning threads decoded 32 prompts 4x slower than one under
    # load 4 (1.3x faster with passive waits), so two shards side by side, a thread each
    # (BENCHMARKS.md, "CPU decoding")
    threads: 1
    resources:
        gpu=scheduling.generate_gpus(config),
        mem_mb=scheduling.stage_mem_mb(config, "generate"),
        runtime=60,
        # one at a time per cluster job (profiles/slurm): a group runs its shards in turn
        engine_jobs=1,
        engine_sharing=engine_settings.server_sharing(config),
    params:
        backend=config["generate"]["backend"],
        backend_args=engine_settings.generate_backend_args(config),
        mode=config["generate"]["mode"],
        rows_version=GENERATED_ROWS,
        sampling=job(datasets.sampling_params, config),
        batch_size=config["generate"]["batch_size"],
        turns=job(datasets.conversation_turns, config),
        follow_up=job(datasets.follow_up_sampling, config),
        near_duplicate_threshold=job(
            datasets.dataset_setting, config, "near_duplicate_threshold"
        ),
        answers=job(datasets.answers_per_prompt, config),
    script:
        "../scripts/generate.py"
