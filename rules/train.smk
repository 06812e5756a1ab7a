rule train:
    """Train one variant of the EAGLE-3 drafter on every hidden-state shard; keep its best
    checkpoint."""
    input:
        # the variant's train.datasets (default: every dataset but train.eval_set)
        shards=job(training.variant_shards, config, SHARDS, VARIANTS),
        # the held-out train.eval_set: evaluated to pick the best epoch, never trained on
        eval_shards=training.eval_set_shards(config, SHARDS),
        # the shared draft vocabulary, or the variant's own where it trains on other datasets
        vocab=job(training.vocab_file, config, VARIANTS),
        fp=target_file("fingerprint.json"),
        # the gate: train only on features that match the serving engine's
        align="results/align/report.json",
        init=job(training.train_init_files, VARIANTS),
    output:
        best="results/train/{variant}/best.safetensors",
        metrics="results/train/{variant}/metrics.jsonl",
    log:
        "logs/train/{variant}.log",
    conda:
        "../envs/specbuild.yaml"
    # torch's intra-op threads on CPU; Snakemake scales this down to --cores
    threads: 4
    resources:
        gpu=job(scheduling.train_gpus, VARIANTS),
        # one batch of features + the target's lm_head and embedding; raise for large targets
        mem_mb=8000,
        runtime=720,
        # how often it logs and checkpoints: changes no output, so a change reruns nothing and
        # a killed run resumes across it (TRAIN_CADENCE, specbuild/config/views.py)
        log_interval=job(training.train_cadence, VARIANTS, "log_interval"),
        save_interval=job(training.train_cadence, VARIANTS, "save_interval"),
    params:
        # Resumable state is deliberately not an output: Snakemake deletes the outputs of a
        # failed job, and a killed job must find its checkpoints to resume.
        state_dir="results/train/{variant}/state",
        # curves for `tensorboard --logdir results/train`; kept across a resume like the state
        tensorboard_dir="results/train/{variant}/tensorboard",
        hparams=job(training.train_hparams, VARIANTS),
    script:
        "../scripts/train.py"
