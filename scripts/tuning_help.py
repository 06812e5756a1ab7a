from specbuild.infra.joblog import start_job_log
from specbuild.tuning import write_launcher_help

start_job_log(snakemake.log[0])
write_launcher_help(snakemake.params.launcher, snakemake.output[0])
