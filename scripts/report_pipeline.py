from specbuild.infra.joblog import start_job_log
from specbuild.report.pipeline import PipelineFiles, write_pipeline_report

start_job_log(snakemake.log[0])
write_pipeline_report(
    datasets=snakemake.params.datasets,
    files=PipelineFiles(
        samples=list(snakemake.input.samples),
        generated=list(snakemake.input.generated),
        tokenized=list(snakemake.input.tokenized),
        hidden=list(snakemake.input.hidden),
        vocab_stats=snakemake.input.vocab,
        align_report=snakemake.input.align,
        train_metrics=snakemake.input.get("train"),
    ),
    outputs=list(snakemake.output),
    curves_dir=snakemake.params.curves,
)
