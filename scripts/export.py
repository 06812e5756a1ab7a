from pathlib import Path

from specbuild.export import export_for_sglang
from specbuild.infra.joblog import start_job_log

start_job_log(snakemake.log[0])
export_for_sglang(
    checkpoint=snakemake.input.best,
    out_dir=Path(snakemake.output.config).parent,
    dtype=snakemake.params.dtype,
)
