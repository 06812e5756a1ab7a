from specbuild.bench.tuning import write_tuning_outputs
from specbuild.joblog import start_job_log

start_job_log(snakemake.log[0])
write_tuning_outputs(
    list(snakemake.input),
    csv_path=snakemake.output.csv,
    md_path=snakemake.output.md,
    plot_path=snakemake.output.plot,
)
