rule variants:
    """Compare every drafter variant (train.variants and base) in one table and one plot:
    training's estimate and, for the benched ones, the acceptance each engine measured.
    """
    input:
        metrics=expand("results/train/{variant}/metrics.jsonl", variant=VARIANTS),
        rows=bench_plan.variant_bench_rows(config, VARIANTS),
        # each variant's draft vocabulary's coverage of the tokens it trains on
        vocab=[training.vocab_stats_file(config, VARIANTS, v) for v in VARIANTS],
    output:
        md="results/tables/variants.md",
        csv="results/tables/variants.csv",
        html=report(
            "results/tables/variants.html",
            caption="../report/variants_table.rst",
            category="Training",
            subcategory="Variants",
        ),
        plot=report(
            "results/plots/variants.png",
            caption="../report/variants_plot.rst",
            category="Training",
            subcategory="Variants",
        ),
    log:
        "logs/report/variants.log",
    # seconds of work: where Snakemake runs (a cluster's login node), never a cluster job
    localrule: True
    conda:
        "../envs/specbuild.yaml"
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        names=list(VARIANTS),
        changes={k: dict(v) for k, v in config["train"]["variants"].items()},
        datasets={v: train_datasets(config, t) for v, t in VARIANTS.items()},
        sets=list(config["bench"]["sets"]),
    script:
        "../scripts/variants.py"
