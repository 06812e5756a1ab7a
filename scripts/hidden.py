from specbuild.engines.gpus import pin_gpus
from specbuild.engines.runtime import Runtime
from specbuild.hidden.core import ShardFiles
from specbuild.hidden.extract import ExtractSettings, extract_shard
from specbuild.infra.joblog import start_job_log

start_job_log(snakemake.log[0])
pin_gpus(snakemake.resources.gpu)  # before anything touches CUDA
extract_shard(
    ShardFiles(
        tokens=snakemake.input.tokens,
        meta=snakemake.input.meta,
        fingerprint=snakemake.input.fp,
        out=snakemake.output[0],
    ),
    ExtractSettings(
        backend=snakemake.params.backend,
        layer_ids=snakemake.params.layer_ids,
        storage=snakemake.params.storage,
        dtype=snakemake.params.dtype,
        batch_tokens=snakemake.params.batch_tokens,
        device=snakemake.params.device,
        backend_options=snakemake.params.backend_options,
        threads=snakemake.threads,
    ),
    Runtime.from_resources(
        sharing=snakemake.resources.engine_sharing, memory=snakemake.resources.engine_memory
    ),
)
