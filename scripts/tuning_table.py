from specbuild.bench.tuning import write_tuning_outputs
from specbuild.io import setup_logging

setup_logging(snakemake.log[0])
write_tuning_outputs(
    list(snakemake.input),
    csv_path=snakemake.output.csv,
    md_path=snakemake.output.md,
    plot_path=snakemake.output.plot,
)
