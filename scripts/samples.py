from pathlib import Path

from specbuild.infra.joblog import start_job_log
from specbuild.rejects import ShardFiles
from specbuild.samples import SampleSettings, write_sample_shard

start_job_log(snakemake.log[0])
write_sample_shard(
    raw=snakemake.input.raw,
    files=ShardFiles(
        out=snakemake.output.samples,
        rejected=snakemake.output.rejected,
        counts=snakemake.output.counts,
    ),
    dataset=snakemake.wildcards.dataset,
    start=snakemake.params.span[0],
    stop=snakemake.params.span[1],
    settings=SampleSettings(
        fmt=snakemake.params.fmt,
        prompt_key=snakemake.params.prompt_key,
        id_key=snakemake.params.id_key,
        max_prompt_tokens=snakemake.params.max_prompt_tokens,
    ),
    target_dir=Path(snakemake.input.fp).parent,
)
