from specbuild.bench.server import write_server_bench_outputs
from specbuild.io import setup_logging

setup_logging(snakemake.log[0])
write_server_bench_outputs(
    list(snakemake.input.summaries),
    list(snakemake.input.sweeps),
    csv_path=snakemake.output.csv,
    md_path=snakemake.output.md,
    sweep_csv_path=snakemake.output.sweep_csv,
    plot_path=snakemake.output.plot,
)
