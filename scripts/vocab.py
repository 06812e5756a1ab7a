from specbuild.vocab import build_vocab

build_vocab(
    tokens=list(snakemake.input.tokens),
    metas=list(snakemake.input.metas),
    fingerprint=snakemake.input.fp,
    out=snakemake.output.vocab,
    stats_out=snakemake.output.stats,
    log_path=snakemake.log[0],
    draft_size=snakemake.params.draft_size,
)
