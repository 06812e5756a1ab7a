# Stage bench: one job per engine, drafter and chain (the baseline's drafter is `none`),
# every set in it; a served engine also sweeps concurrency (the baseline's and
# bench.sweep_drafters'). Rows: specbuild.bench.rows. Drafters: each variant of bench.variants
# (results/drafter/<variant>) and each of bench.drafters (its folder).
# A `sglang` job serves its chain from a server of its own or one kept with its flags
# (sglang.share_idle_s); an `openai` job measures an existing endpoint (its GPUs are not ours
# to schedule); `hf` with bench.hf.exclusive claims every core.


rule bench:
    """Bench every set with one engine, drafter and chain; one row per request (and sweep
    request)."""
    input:
        unpack(job(bench_plan.bench_inputs, config, VARIANTS)),
    output:
        "results/bench/{engine}/{drafter}/{chain}.jsonl",
    log:
        "logs/bench/{engine}/{drafter}/{chain}.log",
    wildcard_constraints:
        engine="hf|sglang|openai",
        drafter=bench_plan.bench_drafter_regex(config, VARIANTS),
        chain=CHAIN_PATTERN,
    # after decoding, before hidden (PRIORITY in specbuild/workflow/scheduling.py)
    priority: PRIORITY["bench"]
    conda:
        job(engine_env)
    threads: job(scheduling.bench_threads, config)
    resources:
        gpu=job(scheduling.bench_gpus, config),
        mem_mb=job(scheduling.stage_mem_mb, config, "bench"),
        runtime=60,
        # a sglang job measures on the shared server of its flags (sglang.share_idle_s)
        engine_sharing=job(engine_settings.server_sharing, config),
    params:
        options=job(bench_plan.bench_options, config, SERVER),
        sets=bench_plan.bench_sets(config),
        max_new_tokens=config["bench"]["max_new_tokens"],
        prompt_limit=job(bench_plan.bench_prompt_limit, config),
        concurrency=job(bench_plan.bench_concurrency, config),
        sweep_min_requests=config["bench"]["sweep_min_requests"],
        rows_version=BENCH_ROWS,
    script:
        "../scripts/bench.py"
