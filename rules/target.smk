rule target:
    """Materialize the target model as an HF folder and fingerprint it."""
    output:
        fp=target_file("fingerprint.json"),
    log:
        f"logs/target/{TARGET}.log",
    conda:
        "../envs/specbuild.yaml"
    resources:
        mem_mb=4000,
        # minutes: a hub id's first run downloads it (Kimi-K2.5: ~600 GB, ~80 min at 1 Gbit/s);
        # a partition with a shorter limit takes --set-resources target:runtime=N
        runtime=180,
    params:
        name=TARGET,
        source=config["target"]["source"],
        save_dtype=config["target"]["save_dtype"],
        trust_remote_code=config["target"]["trust_remote_code"],
    script:
        "../scripts/target.py"
