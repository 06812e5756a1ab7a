from pathlib import Path

from specbuild.bench.tuning import run_tuning_point
from specbuild.gpus import pin_gpus
from specbuild.joblog import start_job_log

start_job_log(snakemake.log[0])
pin_gpus(snakemake.resources.gpu)  # before anything touches CUDA
server = snakemake.params.server
drafter = snakemake.input.get("drafter")
run_tuning_point(
    target_dir=Path(snakemake.input.fp).parent,
    point=snakemake.wildcards.point,
    point_args=snakemake.params.point_args,
    point_env=snakemake.params.point_env,
    base_args=server["server_args"],
    base_env=server["env"],
    out=snakemake.output[0],
    prompt_set=snakemake.params.prompt_set,
    help_text=Path(snakemake.input.help).read_text(),
    prompts=snakemake.params.prompts,
    chain=snakemake.params.chain,
    drafter_dir=str(Path(drafter[0]).parent) if drafter else None,
    launcher=server["launcher"],
    host=server["host"],
    startup_timeout_s=server["startup_timeout_s"],
    request_timeout_s=snakemake.params.request_timeout_s,
    max_new_tokens=snakemake.params.max_new_tokens,
    concurrency=snakemake.params.concurrency,
    sweep_min_requests=snakemake.params.sweep_min_requests,
)
