# SGLang-served measurements: our drafter at each chain vs a baseline server (bench_server),
# and the server tuning sweep, one job (one server start) per chain or tuning point.
# Jobs ask for the server's GPUs (tp_size): with `--resources gpu=N` two servers never share
# GPUs by accident.


rule bench_server:
    """Serve the exported drafter at one chain (or no drafter: baseline); bench and sweep."""
    input:
        unpack(serving_bench_inputs),
    output:
        rows="results/bench_sglang/{chain}.jsonl",
        sweep="results/bench_sglang/{chain}.sweep.jsonl",
        summary="results/bench_sglang/{chain}.summary.json",
    log:
        "logs/bench_sglang/{chain}.log",
    wildcard_constraints:
        chain="baseline|[0-9]+-[0-9]+-[0-9]+",
    conda:
        "../envs/specbuild.yaml"
    resources:
        gpu=sglang_gpus(),
        mem_mb=8000,
        runtime=60,
    params:
        server=sglang_server_options(),
        drafter_name=serving_drafter_name(),
        sets=serving_sets(),
        max_new_tokens=config["sglang"]["bench"]["max_new_tokens"],
        concurrency=config["sglang"]["bench"]["concurrency"],
        sweep_min_requests=config["sglang"]["bench"]["sweep_min_requests"],
        request_timeout_s=config["sglang"]["request_timeout_s"],
    script:
        "../scripts/bench_server.py"


rule bench_server_table:
    """Serving bench tables (summary, concurrency sweep) and the throughput plot."""
    input:
        summaries=expand(
            "results/bench_sglang/{chain}.summary.json", chain=serving_chains()
        ),
        sweeps=expand(
            "results/bench_sglang/{chain}.sweep.jsonl", chain=serving_chains()
        ),
    output:
        csv="results/tables/bench_sglang.csv",
        md="results/tables/bench_sglang.md",
        sweep_csv="results/tables/bench_sglang_sweep.csv",
        plot="results/plots/bench_sglang_throughput.png",
    log:
        "logs/bench_sglang/table.log",
    conda:
        "../envs/specbuild.yaml"
    script:
        "../scripts/bench_server_table.py"


rule sglang_help:
    """The server's --help, once per sweep: every point's flags are checked against it."""
    output:
        "results/tuning/launch_server.help.txt",
    log:
        "logs/tuning/help.log",
    conda:
        "../envs/specbuild.yaml"
    params:
        launcher=config["sglang"]["launcher"],
    script:
        "../scripts/sglang_help.py"


rule tuning_point:
    """Check, start and measure one tuning point; its row records failures too."""
    input:
        unpack(tuning_inputs),
    output:
        "results/tuning/{point}.json",
    log:
        "logs/tuning/{point}.log",
    conda:
        "../envs/specbuild.yaml"
    resources:
        gpu=sglang_gpus(),
        mem_mb=8000,
        runtime=60,
    params:
        server=sglang_server_options(),
        point_args=tuning_point_args,
        point_env=tuning_point_env,
        chain=config["sglang"]["tuning"]["chain"],
        prompt_set=tuning_prompt_set(),
        prompts=config["sglang"]["tuning"]["prompts"],
        max_new_tokens=config["sglang"]["tuning"]["max_new_tokens"],
        concurrency=config["sglang"]["tuning"]["concurrency"],
        sweep_min_requests=config["sglang"]["tuning"]["sweep_min_requests"],
        request_timeout_s=config["sglang"]["request_timeout_s"],
    script:
        "../scripts/tuning.py"


rule tuning:
    """The tuning table (one row per point, with its status) and plot."""
    input:
        expand(
            "results/tuning/{point}.json",
            point=list(config["sglang"]["tuning"]["points"]),
        ),
    output:
        csv="results/tables/tuning.csv",
        md="results/tables/tuning.md",
        plot="results/plots/tuning.png",
    log:
        "logs/tuning/table.log",
    conda:
        "../envs/specbuild.yaml"
    script:
        "../scripts/tuning_table.py"
