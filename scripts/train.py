from specbuild.drafter.train import TrainConfig, TrainFiles, train_drafter
from specbuild.engines.gpus import pin_gpus, train_slots
from specbuild.infra.joblog import start_job_log

start_job_log(snakemake.log[0])
# before anything touches CUDA; no two trainings share a GPU (the rule asks for a majority of
# each GPU's slots)
pin_gpus(snakemake.resources.gpu // train_slots(), slots_each=train_slots())
train_drafter(
    files=TrainFiles(
        shards=list(snakemake.input.shards),
        eval_shards=list(snakemake.input.eval_shards),
        vocab=snakemake.input.vocab,
        target_fingerprint=snakemake.input.fp,
        best_out=snakemake.output.best,
        metrics_out=snakemake.output.metrics,
        state_dir=snakemake.params.state_dir,
        tensorboard_dir=snakemake.params.tensorboard_dir,
    ),
    config=TrainConfig.from_params(
        snakemake.params.hparams,
        log_interval=snakemake.resources.log_interval,
        save_interval=snakemake.resources.save_interval,
    ),
    log_path=snakemake.log[0],
    threads=snakemake.threads,
)
