from specbuild.infra.joblog import start_job_log
from specbuild.report.bench import write_bench_report

start_job_log(snakemake.log[0])
write_bench_report(
    rows=list(snakemake.input.rows),
    train_metrics=snakemake.input.get("train"),
    train_drafter=snakemake.params.train_drafter,
    set_order=snakemake.params.sets,
    peers=snakemake.params.peers,
    outputs=list(snakemake.output),
)
