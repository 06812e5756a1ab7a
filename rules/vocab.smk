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


rule variant_vocab:
    """The draft vocabulary of a variant that trains on other datasets than the base recipe,
    counted on those (specbuild.workflow.training.vocab_file)."""
    input:
        tokens=job(
            training.variant_files,
            config,
            SHARDS,
            VARIANTS,
            "results/tokenized/{dataset}/{shard}.jsonl",
        ),
        metas=job(
            training.variant_files,
            config,
            SHARDS,
            VARIANTS,
            "results/tokenized/{dataset}/{shard}.meta.json",
        ),
        fp=target_file("fingerprint.json"),
        checked=job(
            training.variant_files,
            config,
            SHARDS,
            VARIANTS,
            "results/checks/tokenized/{dataset}/{shard}.json",
        ),
    output:
        vocab="results/vocab/{variant}/vocab.safetensors",
        stats="results/vocab/{variant}/vocab_stats.json",
    log:
        "logs/vocab/{variant}.log",
    conda:
        "../envs/specbuild.yaml"
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        draft_size=config["vocab"]["draft_size"],
    script:
        "../scripts/vocab.py"
