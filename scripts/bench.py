from pathlib import Path

from specbuild.bench.run import BenchSettings, run_bench
from specbuild.engines.gpus import pin_gpus
from specbuild.engines.runtime import with_sharing
from specbuild.infra.joblog import start_job_log

start_job_log(snakemake.log[0])
pin_gpus(snakemake.resources.gpu)  # before anything touches CUDA
drafter = snakemake.input.get("drafter")
run_bench(
    engine=snakemake.wildcards.engine,
    target_dir=Path(snakemake.input.fp).parent,
    chain=snakemake.wildcards.chain,
    out=snakemake.output[0],
    options=with_sharing(snakemake.params.options, snakemake.resources.engine_sharing),
    settings=BenchSettings(
        sets=snakemake.params.sets,
        max_new_tokens=snakemake.params.max_new_tokens,
        prompt_limit=snakemake.params.prompt_limit,
        concurrency=snakemake.params.concurrency,
        sweep_min_requests=snakemake.params.sweep_min_requests,
    ),
    drafter_dir=str(Path(drafter[0]).parent) if drafter else None,
    drafter_name=snakemake.wildcards.drafter,
)
