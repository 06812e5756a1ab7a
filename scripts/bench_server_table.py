from specbuild.bench.server import write_server_bench_outputs
from specbuild.joblog import start_job_log

start_job_log(snakemake.log[0])
write_server_bench_outputs(
    list(snakemake.input.summaries),
    list(snakemake.input.sweeps),
    csv_path=snakemake.output.csv,
    md_path=snakemake.output.md,
    sweep_csv_path=snakemake.output.sweep_csv,
    plot_path=snakemake.output.plot,
)
