from specbuild.infra.joblog import start_job_log
from specbuild.rejects import check_reject_table

start_job_log(snakemake.log[0])
check_reject_table(
    counts=list(snakemake.input.counts),
    limits=snakemake.params.limits,
    csv_path=snakemake.output.csv,
    md_path=snakemake.output.md,
)
