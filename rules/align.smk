# Stage align: training features vs the serving engine's, before train (see specbuild/align.py).


rule align:
    """Recompute a fixed sample of shard rows with the serving engine; stop on a mismatch."""
    input:
        shards=features.align_shards(config, SHARDS, VARIANTS),
        fp=target_file("fingerprint.json"),
    output:
        report="results/align/report.json",
    log:
        "logs/align/align.log",
    conda:
        engine_env(config["align"]["backend"])
    threads: 2
    resources:
        gpu=scheduling.align_gpus(config),
        mem_mb=scheduling.stage_mem_mb(config, "align"),
        runtime=60,
        engine_memory=features.engine_memory(config, "align"),
        # the hidden jobs' kept engine computes the sample where it is the serving one
        engine_sharing=features.feature_sharing(config),
    params:
        backend=config["align"]["backend"],
        backend_options=features.backend_options(config, "align"),
        samples=config["align"]["samples"],
        seed=config["align"]["seed"],
        min_cosine=config["align"]["min_cosine"],
        max_abs_diff=config["align"]["max_abs_diff"],
        norm_ratio_tolerance=config["align"]["norm_ratio_tolerance"],
        dtype=config["align"]["dtype"],
        device=config["align"]["device"],
    script:
        "../scripts/align.py"
