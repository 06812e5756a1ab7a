rule hidden:
    """Run the target over one tokenized shard; write one verified hidden-state shard."""
    input:
        tokens="results/tokenized/{dataset}/{shard}.jsonl",
        meta="results/tokenized/{dataset}/{shard}.meta.json",
        fp=target_file("fingerprint.json"),
        # the shard's reject check: no GPU time on a shard over its limit
        checked="results/checks/tokenized/{dataset}/{shard}.json",
    output:
        # never temp(): hidden states are the expensive part of the build
        "results/hidden/{dataset}/{shard}.safetensors",
    log:
        "logs/hidden/{dataset}/{shard}.log",
    # after the data and the benches on generation's server, before training (PRIORITY in
    # specbuild/workflow/scheduling.py)
    priority: PRIORITY["hidden"]
    conda:
        engine_env(config["hidden"]["backend"])
    # torch's intra-op threads; Snakemake scales this down to --cores
    threads: config["hidden"]["threads"]
    resources:
        gpu=scheduling.hidden_gpus(config),
        # the target's weights, one batch and one shard; less where the run's kept engine
        # holds the weights
        mem_mb=scheduling.hidden_mem_mb(config, workflow),
        runtime=120,
        # one at a time per cluster job (profiles/slurm): a group runs its shards in turn
        engine_jobs=1,
        engine_memory=features.engine_memory(config, "hidden"),
        # one engine for the run's hidden jobs (hidden.share_idle_s); changes no output
        engine_sharing=features.feature_sharing(config),
    params:
        backend=config["hidden"]["backend"],
        backend_options=features.backend_options(config, "hidden"),
        layer_ids=features.aux_layer_ids(config),
        storage=config["hidden"]["storage"],
        dtype=config["hidden"]["dtype"],
        batch_tokens=config["hidden"]["batch_tokens"],
        device=config["hidden"]["device"],
    script:
        "../scripts/hidden.py"
