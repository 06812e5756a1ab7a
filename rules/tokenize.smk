rule tokenize:
    """Render one generated shard with the target's chat template; mark assistant tokens."""
    input:
        generated="results/generated/{dataset}/{shard}.jsonl",
        fp=target_file("fingerprint.json"),
        # the generated shard passed its rejected-row check (rules/rejects.smk)
        checked="results/checks/generated/{dataset}/{shard}.json",
    output:
        tokens="results/tokenized/{dataset}/{shard}.jsonl",
        meta="results/tokenized/{dataset}/{shard}.meta.json",
        rejected="results/tokenized/{dataset}/{shard}.rejected.jsonl",
        counts="results/tokenized/{dataset}/{shard}.counts.json",
    log:
        "logs/tokenize/{dataset}/{shard}.log",
    # seconds a shard, and it gates hidden: before the bench and hidden (PRIORITY in specbuild/workflow/scheduling.py)
    priority: PRIORITY["tokenize"]
    conda:
        "../envs/specbuild.yaml"
    params:
        max_length=config["tokenize"]["max_length"],
        overlong=config["tokenize"]["overlong"],
        rows_version=TOKENIZED_ROWS,
    script:
        "../scripts/tokenize.py"
