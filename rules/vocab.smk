rule vocab:
    """Count loss-masked target tokens over all tokenized shards; write the draft vocab map."""
    input:
        # the base recipe's training data: never the held-out train.eval_set, nor data
        # only a variant trains on (specbuild.workflow.training.vocab_datasets)
        tokens=per_shard(
            "results/tokenized/{dataset}/{shard}.jsonl",
            training.vocab_datasets(config),
        ),
        metas=per_shard(
            "results/tokenized/{dataset}/{shard}.meta.json",
            training.vocab_datasets(config),
        ),
        fp=target_file("fingerprint.json"),
        # every tokenized shard passed its rejected-row check (rules/rejects.smk)
        checked=per_shard(
            "results/checks/tokenized/{dataset}/{shard}.json",
            training.vocab_datasets(config),
        ),
    output:
        vocab="results/vocab/vocab.safetensors",
        stats="results/vocab/vocab_stats.json",
    log:
        "logs/vocab/vocab.log",
    conda:
        "../envs/specbuild.yaml"
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        draft_size=config["vocab"]["draft_size"],
    script:
        "../scripts/vocab.py"
