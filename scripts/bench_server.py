from pathlib import Path

from specbuild.bench.server import run_server_bench
from specbuild.gpus import pin_gpus
from specbuild.joblog import start_job_log

start_job_log(snakemake.log[0])
pin_gpus(snakemake.resources.gpu)  # before anything touches CUDA
server = snakemake.params.server
drafter = snakemake.input.get("drafter")
run_server_bench(
    target_dir=Path(snakemake.input.fp).parent,
    config=snakemake.wildcards.chain,
    sets=snakemake.params.sets,
    out_rows=snakemake.output.rows,
    out_sweep=snakemake.output.sweep,
    out_summary=snakemake.output.summary,
    drafter_dir=str(Path(drafter[0]).parent) if drafter else None,
    drafter_name=snakemake.params.drafter_name if drafter else "none",
    launcher=server["launcher"],
    server_args=server["server_args"],
    env=server["env"],
    host=server["host"],
    startup_timeout_s=server["startup_timeout_s"],
    request_timeout_s=snakemake.params.request_timeout_s,
    max_new_tokens=snakemake.params.max_new_tokens,
    concurrency=snakemake.params.concurrency,
    sweep_min_requests=snakemake.params.sweep_min_requests,
)
