# Every table and plot of `snakemake --report results/report.html`, written by specbuild.report
# and flagged report() with its category and caption (report/<name>_table.rst, _plot.rst).
# Tables come as .csv, .md and .html; which exist follows the config
# (specbuild/workflow/report_plan.py).


rule report_bench:
    """Bench tables (acceptance, positions, latency, sweep, training's estimate) and plots."""
    input:
        unpack(job(report_plan.bench_report_inputs, config, VARIANTS)),
    output:
        report_files(report_plan.bench_report_files(config, VARIANTS)),
    log:
        "logs/report/bench.log",
    # seconds of work: where Snakemake runs (a cluster's login node), never a cluster job
    localrule: True
    conda:
        "../envs/specbuild.yaml"
    params:
        sets=list(config["bench"]["sets"]),
        train_drafter=report_plan.train_metrics_variant(config, VARIANTS),
        peers=list(config["bench"]["drafters"]),
    script:
        "../scripts/report_bench.py"


rule report_pipeline:
    """Data kept and rejected, token counts, vocabulary coverage, alignment, disk use, curves."""
    input:
        unpack(job(report_plan.pipeline_report_inputs, config, SHARDS)),
    output:
        report_files(report_plan.pipeline_report_files(config)),
    log:
        "logs/report/pipeline.log",
    # seconds of work: where Snakemake runs (a cluster's login node), never a cluster job
    localrule: True
    conda:
        "../envs/specbuild.yaml"
    params:
        datasets=list(config["datasets"]),
        curves=report_plan.train_curves_dir(config),
    script:
        "../scripts/report_pipeline.py"


rule report_tuning:
    """The tuning table (one row per point, with its status) and plot."""
    input:
        expand("results/tuning/{point}.json", point=tuning_plan.tuning_points(config)),
    output:
        report_files(report_plan.tuning_report_files(config)),
    log:
        "logs/report/tuning.log",
    # seconds of work: where Snakemake runs (a cluster's login node), never a cluster job
    localrule: True
    conda:
        "../envs/specbuild.yaml"
    script:
        "../scripts/report_tuning.py"


rule report:
    """Every table and plot the HTML report shows (then: snakemake --report results/report.html)."""
    input:
        report_plan.report_paths(config, VARIANTS),
