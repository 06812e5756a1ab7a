from specbuild.infra.joblog import start_job_log
from specbuild.tokenization import tokenize_shard

start_job_log(snakemake.log[0])
tokenize_shard(
    generated=snakemake.input.generated,
    fingerprint=snakemake.input.fp,
    out=snakemake.output.tokens,
    meta=snakemake.output.meta,
    rejected=snakemake.output.rejected,
    counts=snakemake.output.counts,
    max_length=snakemake.params.max_length,
    overlong=snakemake.params.overlong,
)
