from pathlib import Path

from specbuild.align import AlignSettings, check_alignment
from specbuild.engines.gpus import pin_gpus
from specbuild.engines.runtime import Runtime, sharing_seconds
from specbuild.infra.joblog import start_job_log

start_job_log(snakemake.log[0])
pin_gpus(snakemake.resources.gpu)  # before anything touches CUDA
check_alignment(
    shards=list(snakemake.input.shards),
    target_dir=Path(snakemake.input.fp).parent,
    report=snakemake.output.report,
    settings=AlignSettings(
        backend=snakemake.params.backend,
        backend_options=Runtime.from_resources(
            memory=snakemake.resources.engine_memory
        ).with_memory(snakemake.params.backend_options),
        samples=snakemake.params.samples,
        seed=snakemake.params.seed,
        min_cosine=snakemake.params.min_cosine,
        max_abs_diff=snakemake.params.max_abs_diff,
        norm_ratio_tolerance=snakemake.params.norm_ratio_tolerance,
        dtype=snakemake.params.dtype,
        device=snakemake.params.device,
    ),
    share_idle_s=sharing_seconds(snakemake.resources.engine_sharing),
)
