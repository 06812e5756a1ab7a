rule samples:
    """Normalize one fixed slice of a raw dataset into a samples shard."""
    input:
        # ancient(): appending records must not make every shard stale; each shard's own
        # content digest (params.digest) decides instead.
        raw=ancient(job(datasets.dataset_setting, config, "path")),
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
        dataset=datasets.datasets_regex(config, synthetic=False),
    # decoding first (PRIORITY in specbuild/workflow/scheduling.py): a file's shards gate their `generate` jobs
    priority: PRIORITY["decode"]
    conda:
        "../envs/specbuild.yaml"
    params:
        digest=job(SHARDS.digest),
        span=job(datasets.shard_range, config),
        fmt=job(datasets.dataset_setting, config, "format"),
        prompt_key=job(datasets.dataset_setting, config, "prompt_key"),
        id_key=job(datasets.dataset_setting, config, "id_key"),
        max_prompt_tokens=job(datasets.dataset_setting, config, "max_prompt_tokens"),
        rows_version=SAMPLE_ROWS,
    script:
        "../scripts/samples.py"
