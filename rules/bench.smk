# Stage bench: one job per engine and config (a chain, or the baseline without a drafter),
# every set in it; a served engine also sweeps concurrency. Rows: specbuild.bench.rows.
# A `sglang` job starts one server for its config; an `openai` job measures an existing
# endpoint (its GPUs are not ours to schedule); `hf` with bench.hf.exclusive claims every core.


rule bench:
    """Bench every set with one engine at one config; one row per request (and sweep request)."""
    input:
        unpack(bench_inputs),
    output:
        "results/bench/{engine}/{chain}.jsonl",
    log:
        "logs/bench/{engine}/{chain}.log",
    wildcard_constraints:
        engine="hf|sglang|openai",
        chain=CONFIG_PATTERN,
    conda:
        bench_env
    threads: bench_threads
    resources:
        gpu=bench_gpus,
        mem_mb=8000,
        runtime=60,
    params:
        options=bench_options,
        sets=bench_sets(),
        drafter_name=config["bench"]["drafter_name"],
        max_new_tokens=config["bench"]["max_new_tokens"],
        prompt_limit=bench_prompt_limit,
        concurrency=bench_concurrency,
        sweep_min_requests=config["bench"]["sweep_min_requests"],
    script:
        "../scripts/bench.py"
