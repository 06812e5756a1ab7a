from functools import partial

import specbuild
from specbuild.backends import SamplingParams, make_backend
from specbuild.engines.gpus import pin_gpus
from specbuild.engines.runtime import with_sharing
from specbuild.generate import GenerateSettings, generate_shard
from specbuild.infra.joblog import start_job_log
from specbuild.infra.orphans import job_key, keep_if_orphan, reuse_orphan
from specbuild.rejects import ShardFiles

start_job_log(snakemake.log[0])
pin_gpus(snakemake.resources.gpu)  # before anything touches CUDA
# a job that finished after its snakemake was killed is not done again (infra.orphans)
outputs = [snakemake.output.generated, snakemake.output.rejected, snakemake.output.counts]
params = {**dict(snakemake.params.items()), "specbuild": specbuild.__version__}
key = job_key(params, list(snakemake.input))
if not reuse_orphan(outputs, key):
    generate_shard(
        samples=snakemake.input.samples,
        fingerprint=snakemake.input.fp,
        files=ShardFiles(
            out=snakemake.output.generated,
            rejected=snakemake.output.rejected,
            counts=snakemake.output.counts,
        ),
        backend=partial(
            make_backend,
            snakemake.params.backend,
            **with_sharing(snakemake.params.backend_args, snakemake.resources.engine_sharing),
        ),
        settings=GenerateSettings(
            mode=snakemake.params.mode,
            sampling=SamplingParams(**snakemake.params.sampling),
            batch_size=snakemake.params.batch_size,
            turns=snakemake.params.turns,
            follow_up=SamplingParams(**snakemake.params.follow_up),
            near_duplicate_threshold=snakemake.params.near_duplicate_threshold,
            answers=snakemake.params.answers.get("answers", 1),
        ),
        earlier=list(snakemake.input.earlier),
    )
    keep_if_orphan(outputs, key)
