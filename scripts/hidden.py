from specbuild.engines.gpus import pin_gpus
from specbuild.engines.runtime import sharing_seconds, with_memory
from specbuild.hidden.shard_job import extract_shard
from specbuild.joblog import start_job_log

start_job_log(snakemake.log[0])
pin_gpus(snakemake.resources.gpu)  # before anything touches CUDA
extract_shard(
    tokens=snakemake.input.tokens,
    meta=snakemake.input.meta,
    fingerprint=snakemake.input.fp,
    out=snakemake.output[0],
    backend=snakemake.params.backend,
    layer_ids=snakemake.params.layer_ids,
    storage=snakemake.params.storage,
    dtype=snakemake.params.dtype,
    batch_tokens=snakemake.params.batch_tokens,
    device=snakemake.params.device,
    backend_options=with_memory(
        snakemake.params.backend_options, snakemake.resources.engine_memory
    ),
    threads=snakemake.threads,
    share_idle_s=sharing_seconds(snakemake.resources.engine_sharing),
)
