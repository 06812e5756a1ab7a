from pathlib import Path

from specbuild.joblog import start_job_log
from specbuild.report.tables import write_tables

start_job_log(snakemake.log[0])
write_tables(
    rows=list(snakemake.input.rows),
    out_dir=Path(snakemake.output.bench).parent,
    train_metrics=snakemake.input.get("train"),
)
