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
        runtime=30,
    params:
        name=TARGET,
        source=config["target"]["source"],
        save_dtype=config["target"]["save_dtype"],
        trust_remote_code=config["target"]["trust_remote_code"],
    script:
        "../scripts/target.py"
