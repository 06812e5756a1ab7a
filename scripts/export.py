from pathlib import Path

from specbuild.disk import ensure_free_space, export_need
from specbuild.export import export_for_sglang
from specbuild.joblog import start_job_log

start_job_log(snakemake.log[0])
ensure_free_space(
    snakemake.output.config,
    export_need(checkpoint=snakemake.input.best, dtype=snakemake.params.dtype),
    "an exported drafter",
)
export_for_sglang(
    checkpoint=snakemake.input.best,
    out_dir=Path(snakemake.output.config).parent,
    dtype=snakemake.params.dtype,
)
