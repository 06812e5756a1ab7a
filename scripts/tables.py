from pathlib import Path

from specbuild.io import setup_logging
from specbuild.report.tables import write_tables

setup_logging(snakemake.log[0])
write_tables(
    rows=list(snakemake.input.rows),
    out_dir=Path(snakemake.output.bench).parent,
    train_metrics=snakemake.input.get("train"),
)
