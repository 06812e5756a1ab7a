# Stage align: training features vs the serving engine's, before train (see specbuild/align.py).


rule align:
    """Recompute a fixed sample of shard rows with the serving engine; stop on a mismatch."""
    input:
        shards=align_shards(),
        fp=target_file("fingerprint.json"),
    output:
        report="results/align/report.json",
    log:
        "logs/align/align.log",
    conda:
        engine_env(config["align"]["backend"])
    threads: 2
    resources:
        gpu=align_gpus(),
        mem_mb=6000,
        runtime=60,
        engine_memory=feature_engine_memory(config["align"]["backend"]),
    params:
        backend=config["align"]["backend"],
        backend_options=align_backend_options(),
        samples=config["align"]["samples"],
        seed=config["align"]["seed"],
        min_cosine=config["align"]["min_cosine"],
        max_abs_diff=config["align"]["max_abs_diff"],
        norm_ratio_tolerance=config["align"]["norm_ratio_tolerance"],
        dtype=config["align"]["dtype"],
        device=config["align"]["device"],
    script:
        "../scripts/align.py"
