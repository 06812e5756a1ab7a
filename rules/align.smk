# Stage align: training features vs the serving engine's, before train (see specbuild/align.py).


def align_shards():
    """The first hidden shard of each dataset: a fixed sample that appending data never moves."""
    return [
        f"results/hidden/{d}/{shard_ids(d)[0]}.safetensors"
        for d in config["datasets"]
        if shard_ids(d)
    ]


def align_backend_options():
    """Engine settings of the serving feature backend; hf needs none beyond dtype/device."""
    return sglang_feature_args() if config["align"]["backend"] == "sglang" else {}


def align_gpus():
    if config["align"]["backend"] == "sglang":
        return sglang_gpus()
    return device_gpus(config["align"]["device"])


rule align:
    """Recompute a fixed sample of shard rows with the serving engine; stop on a mismatch."""
    input:
        shards=align_shards(),
        fp=target_file("fingerprint.json"),
    output:
        report="results/align/report.json",
        csv="results/tables/align.csv",
        md="results/tables/align.md",
    log:
        "logs/align/align.log",
    threads: 2
    resources:
        gpu=align_gpus(),
        mem_mb=6000,
        runtime=60,
    params:
        backend=config["align"]["backend"],
        backend_options=align_backend_options(),
        samples=config["align"]["samples"],
        seed=config["align"]["seed"],
        min_cosine=config["align"]["min_cosine"],
        max_abs_diff=config["align"]["max_abs_diff"],
        norm_ratio_tolerance=config["align"]["norm_ratio_tolerance"],
        dtype=config["align"]["dtype"],
        device=config["align"]["device"],
    script:
        "../scripts/align.py"
