from pathlib import Path

from specbuild.engines.gpus import pin_gpus
from specbuild.engines.runtime import sharing_seconds
from specbuild.engines.server import ServerOptions
from specbuild.infra.joblog import start_job_log
from specbuild.tuning import TuningPoint, TuningSettings, run_tuning_point

start_job_log(snakemake.log[0])
pin_gpus(snakemake.resources.gpu)  # before anything touches CUDA
drafter = snakemake.input.get("drafter")
run_tuning_point(
    target_dir=Path(snakemake.input.fp).parent,
    point=TuningPoint(
        name=snakemake.wildcards.point,
        args=snakemake.params.point_args,
        env=snakemake.params.point_env,
    ),
    server=ServerOptions(**snakemake.params.server),
    out=snakemake.output[0],
    help_text=Path(snakemake.input.help).read_text(),
    settings=TuningSettings(
        prompt_set=snakemake.params.prompt_set,
        prompts=snakemake.params.prompts,
        chain=snakemake.params.chain,
        max_new_tokens=snakemake.params.max_new_tokens,
        concurrency=snakemake.params.concurrency,
        sweep_min_requests=snakemake.params.sweep_min_requests,
    ),
    drafter_dir=str(Path(drafter[0]).parent) if drafter else None,
    share_idle_s=sharing_seconds(snakemake.resources.engine_sharing),
)
