from functools import partial

from specbuild.backends import make_backend
from specbuild.engines.gpus import pin_gpus
from specbuild.engines.runtime import with_sharing
from specbuild.infra.joblog import start_job_log
from specbuild.rejects import ShardFiles
from specbuild.synthesize import PromptWriting, synthesize_shard

start_job_log(snakemake.log[0])
pin_gpus(snakemake.resources.gpu)  # before anything touches CUDA
synthesize_shard(
    fingerprint=snakemake.input.fp,
    files=ShardFiles(
        out=snakemake.output.samples,
        rejected=snakemake.output.rejected,
        counts=snakemake.output.counts,
    ),
    dataset=snakemake.wildcards.dataset,
    start=snakemake.params.span[0],
    stop=snakemake.params.span[1],
    backend=partial(
        make_backend,
        snakemake.params.backend,
        **with_sharing(snakemake.params.backend_args, snakemake.resources.engine_sharing),
    ),
    writing=PromptWriting.from_param(snakemake.params.sampling),
    batch_size=snakemake.params.batch_size,
)
