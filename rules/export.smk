rule export:
    """Write a variant's best drafter as the folder SGLang loads, and check every key and shape."""
    input:
        best="results/train/{variant}/best.safetensors",
    output:
        config="results/drafter/{variant}/config.json",
        weights="results/drafter/{variant}/model.safetensors",
    log:
        "logs/export/{variant}.log",
    conda:
        "../envs/specbuild.yaml"
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        dtype=config["export"]["dtype"],
    script:
        "../scripts/export.py"
