from specbuild.infra.joblog import start_job_log
from specbuild.vocab import build_vocab

start_job_log(snakemake.log[0])
build_vocab(
    tokens=list(snakemake.input.tokens),
    metas=list(snakemake.input.metas),
    fingerprint=snakemake.input.fp,
    out=snakemake.output.vocab,
    stats_out=snakemake.output.stats,
    draft_size=snakemake.params.draft_size,
)
