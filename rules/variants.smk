rule variants:
    """Compare every drafter variant (train.variants and base) in one table and one plot."""
    input:
        metrics=expand("results/train/{variant}/metrics.jsonl", variant=VARIANTS),
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
    conda:
        "../envs/specbuild.yaml"
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        names=list(VARIANTS),
        changes={k: dict(v) for k, v in config["train"]["variants"].items()},
    script:
        "../scripts/variants.py"
