from pathlib import Path

from specbuild.infra.joblog import start_job_log
from specbuild.target import materialize_target

start_job_log(snakemake.log[0])
materialize_target(
    source=snakemake.params.source,
    name=snakemake.params.name,
    out_dir=Path(snakemake.output.fp).parent,
    save_dtype=snakemake.params.save_dtype,
    trust_remote_code=snakemake.params.trust_remote_code,
)
