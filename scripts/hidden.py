from specbuild.hidden.extract import extract_shard

extract_shard(
    tokens=snakemake.input.tokens,
    meta=snakemake.input.meta,
    fingerprint=snakemake.input.fp,
    out=snakemake.output[0],
    log_path=snakemake.log[0],
    backend=snakemake.params.backend,
    layer_ids=snakemake.params.layer_ids,
    storage=snakemake.params.storage,
    dtype=snakemake.params.dtype,
    batch_tokens=snakemake.params.batch_tokens,
    device=snakemake.params.device,
    backend_options=snakemake.params.backend_options,
    threads=snakemake.threads,
)
