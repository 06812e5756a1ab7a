# `make serve`: the SGLang command for the built drafter (see specbuild/serve.py).


rule serve:
    """Write results/serve.sh: SGLang serving the drafter at the fastest measured chain."""
    input:
        drafter=bench_drafter_files(served_drafter()),
        fp=target_file("fingerprint.json"),
        rows=serve_rows(),
    output:
        "results/serve.sh",
    log:
        "logs/serve.log",
    conda:
        "../envs/specbuild.yaml"
    params:
        chains=list(config["bench"]["chains"]),
        server=sglang_server_options(),
        port=config["sglang"]["serve_port"],
    script:
        "../scripts/serve.py"
