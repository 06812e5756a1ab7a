# Tables and plots over every bench row file, for `snakemake --report results/report.html`.
# Files marked report() appear in the HTML report with their caption from report/*.rst.


rule bench_tables:
    """Aggregate bench rows per set x config x drafter; compare with training's estimate."""
    input:
        unpack(report_tables_inputs),
    output:
        bench=report(
            "results/tables/bench.html",
            caption="../report/bench_table.rst",
            category="Benchmark",
            subcategory="Tables",
        ),
        positions=report(
            "results/tables/positions.html",
            caption="../report/positions_table.rst",
            category="Benchmark",
            subcategory="Tables",
        ),
        train_vs_bench=report(
            "results/tables/train_vs_bench.html",
            caption="../report/train_vs_bench_table.rst",
            category="Benchmark",
            subcategory="Tables",
        ),
        other=expand("results/tables/{t}.{ext}", t=BENCH_TABLES, ext=["csv", "md"]),
    log:
        "logs/report/tables.log",
    conda:
        "../envs/specbuild.yaml"
    resources:
        mem_mb=1000,
        runtime=10,
    script:
        "../scripts/tables.py"


rule bench_plots:
    """Seaborn plots of acceptance length, per-position acceptance and speedup."""
    input:
        rows=bench_row_files(),
    output:
        acceptance=report(
            "results/plots/acceptance_length.png",
            caption="../report/acceptance_plot.rst",
            category="Benchmark",
            subcategory="Plots",
        ),
        positions=report(
            "results/plots/acceptance_by_position.png",
            caption="../report/positions_plot.rst",
            category="Benchmark",
            subcategory="Plots",
        ),
        speedup=report(
            "results/plots/speedup.png",
            caption="../report/speedup_plot.rst",
            category="Benchmark",
            subcategory="Plots",
        ),
    log:
        "logs/report/plots.log",
    conda:
        "../envs/specbuild.yaml"
    resources:
        mem_mb=1000,
        runtime=10,
    script:
        "../scripts/plots.py"


rule report:
    """Every table and plot the HTML report shows (then: snakemake --report results/report.html)."""
    input:
        bench_outputs(),
