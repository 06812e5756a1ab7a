from specbuild.infra.joblog import start_job_log
from specbuild.report.tuning import write_tuning_report

start_job_log(snakemake.log[0])
write_tuning_report(list(snakemake.input), outputs=list(snakemake.output))
