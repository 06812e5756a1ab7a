from pathlib import Path

from specbuild.io import setup_logging
from specbuild.report.plots import write_plots

setup_logging(snakemake.log[0])
write_plots(rows=list(snakemake.input.rows), out_dir=Path(snakemake.output.acceptance).parent)
