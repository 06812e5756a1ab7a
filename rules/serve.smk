# `make serve`: the SGLang command for the built drafter (see specbuild/serve.py).


rule serve:
    """Write results/serve.sh: SGLang serving the drafter at the fastest measured chain."""
    input:
        drafter=serving_drafter_files(),
        fp=target_file("fingerprint.json"),
        summaries=serve_summaries(),
    output:
        "results/serve.sh",
    log:
        "logs/serve.log",
    conda:
        "../envs/specbuild.yaml"
    params:
        chains=list(config["sglang"]["bench"]["chains"]),
        launcher=list(config["sglang"]["launcher"]),
        server_args=dict(config["sglang"]["server_args"]),
        env={k: str(v) for k, v in config["sglang"]["env"].items()},
        host=config["sglang"]["host"],
        port=config["sglang"]["serve_port"],
    script:
        "../scripts/serve.py"
