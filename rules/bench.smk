# Stage bench: one job per engine, drafter and chain (the baseline's drafter is `none`),
# every set in it; a served engine also sweeps concurrency (the baseline's and
# bench.sweep_drafters'). Rows: specbuild.bench.rows. Drafters: each variant of bench.variants
# (results/drafter/<variant>) and each of bench.drafters (its folder).
# A `sglang` job starts one server for its chain; an `openai` job measures an existing
# endpoint (its GPUs are not ours to schedule); `hf` with bench.hf.exclusive claims every core.

from specbuild.formats import BENCH_ROWS


rule bench:
    """Bench every set with one engine, drafter and config; one row per request (and sweep
    request)."""
    input:
        unpack(bench_inputs),
    output:
        "results/bench/{engine}/{drafter}/{chain}.jsonl",
    log:
        "logs/bench/{engine}/{drafter}/{chain}.log",
    wildcard_constraints:
        engine="hf|sglang|openai",
        drafter=bench_drafter_regex(),
        chain=CONFIG_PATTERN,
    # after decoding, before hidden (common.smk, PRIORITY)
    priority: PRIORITY["bench"]
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
        max_new_tokens=config["bench"]["max_new_tokens"],
        prompt_limit=bench_prompt_limit,
        concurrency=bench_concurrency,
        sweep_min_requests=config["bench"]["sweep_min_requests"],
        rows_version=BENCH_ROWS,
    script:
        "../scripts/bench.py"
