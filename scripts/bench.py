from pathlib import Path

from specbuild.bench.specdec import run_specdec_bench
from specbuild.gpus import pin_gpus
from specbuild.joblog import start_job_log

start_job_log(snakemake.log[0])
pin_gpus(snakemake.resources.gpu)  # before anything touches CUDA
run_specdec_bench(
    target_dir=Path(snakemake.input.fp).parent,
    set_name=snakemake.wildcards.set,
    set_spec=snakemake.params.set_spec,
    config=snakemake.wildcards.chain,
    out=snakemake.output[0],
    drafter_dir=snakemake.params.drafter_dir,
    drafter_name=snakemake.params.drafter_name,
    backend=snakemake.params.backend,
    max_new_tokens=snakemake.params.max_new_tokens,
    dtype=snakemake.params.dtype,
    device=snakemake.params.device,
    threads=snakemake.params.threads,
)
