rule samples:
    """Normalize one fixed slice of a raw dataset into a samples shard."""
    input:
        # ancient(): appending records must not make every shard stale; each shard's own
        # content digest (params.digest) decides instead.
        raw=ancient(raw_dataset_path),
    output:
        samples="results/samples/{dataset}/{shard}.jsonl",
        rejected="results/samples/{dataset}/{shard}.rejected.jsonl",
    log:
        "logs/samples/{dataset}/{shard}.log",
    conda:
        "../envs/specbuild.yaml"
    params:
        digest=shard_digest,
        span=shard_range,
        fmt=dataset_param("format"),
        prompt_key=dataset_param("prompt_key"),
        max_rejected_fraction=config["samples"]["max_rejected_fraction"],
    script:
        "../scripts/samples.py"
