from pathlib import Path

from specbuild.joblog import start_job_log
from specbuild.report.plots import write_plots

start_job_log(snakemake.log[0])
write_plots(rows=list(snakemake.input.rows), out_dir=Path(snakemake.output.acceptance).parent)
