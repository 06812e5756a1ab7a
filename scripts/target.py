from pathlib import Path

from specbuild.io import setup_logging
from specbuild.target import materialize_target

setup_logging(snakemake.log[0])
materialize_target(
    source=snakemake.params.source,
    name=snakemake.params.name,
    out_dir=Path(snakemake.output.fp).parent,
    save_dtype=snakemake.params.save_dtype,
)
