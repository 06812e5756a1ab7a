rule export:
    """Write the best drafter as the folder SGLang loads, and check every key and shape."""
    input:
        best="results/train/best.safetensors",
    output:
        config="results/drafter/config.json",
        weights="results/drafter/model.safetensors",
    log:
        "logs/export/export.log",
    conda:
        "../envs/specbuild.yaml"
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        dtype=config["export"]["dtype"],
    script:
        "../scripts/export.py"
