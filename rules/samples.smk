rule samples:
    """Normalize one fixed slice of a raw dataset into a samples shard."""
    input:
        # ancient(): appending records must not make every shard stale; each shard's own
        # content digest (params.digest) decides instead.
        raw=ancient(raw_dataset_path),
        # The target's tokenizer and chat template count each prompt's tokens exactly, so a
        # prompt over max_prompt_tokens is rejected here with its file and line, before
        # `generate` tries to allocate for it. (A character bound without the tokenizer would
        # have to be loose to be safe and re-checked later; this way the shard is final.)
        fp=target_file("fingerprint.json"),
    output:
        samples="results/samples/{dataset}/{shard}.jsonl",
        rejected="results/samples/{dataset}/{shard}.rejected.jsonl",
        counts="results/samples/{dataset}/{shard}.counts.json",
    log:
        "logs/samples/{dataset}/{shard}.log",
    wildcard_constraints:
        dataset=datasets_regex(synthetic=False),
    # decoding first (common.smk, PRIORITY): a file's shards gate their `generate` jobs
    priority: PRIORITY["decode"]
    conda:
        "../envs/specbuild.yaml"
    params:
        digest=shard_digest,
        span=shard_range,
        fmt=dataset_param("format"),
        prompt_key=dataset_param("prompt_key"),
        id_key=dataset_param("id_key"),
        max_prompt_tokens=dataset_param("max_prompt_tokens"),
        rows_version=SAMPLE_ROWS,
    script:
        "../scripts/samples.py"


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
        dataset=datasets_regex(synthetic=True),
    # the head of the longest chain (common.smk, PRIORITY)
    priority: PRIORITY["synthesize"]
    conda:
        engine_env(config["generate"]["backend"])
    # one torch thread: two spinning threads decoded 32 prompts 4x slower than one under
    # load 4 (1.3x faster with passive waits), so two shards side by side, a thread each
    # (BENCHMARKS.md, "CPU decoding")
    threads: 1
    resources:
        gpu=generate_gpus(),
        mem_mb=4000,
        runtime=60,
    params:
        span=shard_range,
        backend=config["generate"]["backend"],
        backend_args=generate_backend_args(),
        sampling=synthesize_sampling,
        batch_size=config["generate"]["batch_size"],
    script:
        "../scripts/synthesize.py"
