# The SGLang server tuning sweep: one job per point (a server start, or a kept server of its
# flags), checked first against the server's own --help. Jobs ask for the server's GPUs
# (tp_size): with `--resources gpu=N` two servers never share GPUs by accident. Its table and
# plot: rules/report.smk.


rule tuning_help:
    """The server's --help, once per sweep: every point's flags are checked against it."""
    output:
        tuning_plan.HELP_FILE,
    log:
        "logs/tuning/help.log",
    # its points wait on it (PRIORITY in specbuild/workflow/scheduling.py)
    priority: PRIORITY["tuning"]
    conda:
        engine_env("sglang")
    params:
        launcher=config["sglang"]["launcher"],
    script:
        "../scripts/tuning_help.py"


rule tuning:
    """Check, start and measure one tuning point; its row records failures too."""
    input:
        unpack(job(tuning_plan.tuning_inputs, config, VARIANTS)),
    output:
        "results/tuning/{point}.json",
    log:
        "logs/tuning/{point}.log",
    # on generation's kept server, before hidden's runner takes the GPU (PRIORITY in
    # specbuild/workflow/scheduling.py)
    priority: PRIORITY["tuning"]
    conda:
        engine_env("sglang")
    resources:
        gpu=scheduling.sglang_gpus(config),
        mem_mb=scheduling.stage_mem_mb(config, "tuning"),
        runtime=60,
        # a point with its chain's bench flags measures on that server (sglang.share_idle_s)
        engine_sharing=engine_settings.server_sharing(config, "sglang"),
    params:
        server=SERVER,
        point_args=job(tuning_plan.tuning_point_args, config),
        point_env=job(tuning_plan.tuning_point_env, config),
        chain=config["sglang"]["tuning"]["chain"],
        prompt_set=tuning_plan.tuning_prompt_set(config),
        prompts=config["sglang"]["tuning"]["prompts"],
        max_new_tokens=config["sglang"]["tuning"]["max_new_tokens"],
        concurrency=config["sglang"]["tuning"]["concurrency"],
        sweep_min_requests=config["sglang"]["tuning"]["sweep_min_requests"],
    script:
        "../scripts/tuning.py"
