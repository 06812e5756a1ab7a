# `make serve`: the SGLang command for the built drafter (see specbuild/serve.py).


rule serve:
    """Write results/serve.sh: SGLang serving the drafter at the fastest measured chain."""
    input:
        drafter=bench_plan.bench_drafter_files(
            config, VARIANTS, bench_plan.served_drafter(config, VARIANTS)
        ),
        fp=target_file("fingerprint.json"),
        rows=bench_plan.serve_rows(config, VARIANTS),
    output:
        "results/serve.sh",
    log:
        "logs/serve.log",
    # seconds of work: where Snakemake runs (a cluster's login node), never a cluster job
    localrule: True
    conda:
        "../envs/specbuild.yaml"
    params:
        chains=bench_plan.drafter_chains(
            config, bench_plan.served_drafter(config, VARIANTS)
        ),
        server=SERVER,
        port=config["sglang"]["serve_port"],
        # the variable's name only: serve.sh reads the key when it runs
        api_key_env=config["sglang"]["serve_api_key_env"],
    script:
        "../scripts/serve.py"
