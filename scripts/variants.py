from specbuild.infra.joblog import start_job_log
from specbuild.variants import write_variants

start_job_log(snakemake.log[0])
write_variants(
    metrics=dict(zip(snakemake.params.names, snakemake.input.metrics, strict=True)),
    changes=snakemake.params.changes,
    datasets=snakemake.params.datasets,
    vocab=dict(zip(snakemake.params.names, snakemake.input.vocab, strict=True)),
    rows=list(snakemake.input.rows),
    set_order=snakemake.params.sets,
    table=snakemake.output.md,
    plot=snakemake.output.plot,
)
