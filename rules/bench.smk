# Speculative decoding with the exported drafter vs greedy decoding without one, in PyTorch:
# one job per (set, chain), rows in the schema of specbuild.bench.specdec.
# With bench.exclusive, timed jobs claim every core, so two timed jobs never share the CPU.

import os

from specbuild.bench.specdec import ChainSpec

# Fail at parse time, not after hours of training, on a chain the engine cannot run.
for _chain in config["bench"]["chains"]:
    ChainSpec.parse(_chain)


def bench_set_names():
    return list(config["bench"]["sets"])


def bench_chains():
    """Configs benched per set: the baseline (if on) and every chain, e.g. "3-1-4"."""
    b = config["bench"]
    return (["baseline"] if b["baseline"] else []) + list(b["chains"])


def bench_row_files():
    return [
        f"results/bench/{s}/{c}.jsonl"
        for s in bench_set_names()
        for c in bench_chains()
    ]


def bench_drafter_files():
    folder = config["bench"]["drafter"].rstrip("/")
    return [f"{folder}/config.json", f"{folder}/model.safetensors"]


def bench_inputs(wildcards):
    """Target fingerprint and prompt file; the drafter's files for every chain but baseline."""
    inputs = {
        "fp": target_file("fingerprint.json"),
        "prompts": config["bench"]["sets"][wildcards.set]["path"],
    }
    if wildcards.chain != "baseline":
        inputs["drafter"] = bench_drafter_files()
    return inputs


def bench_set_spec(wildcards):
    """The set's config entry as a plain dict (schema defaults filled in)."""
    return dict(config["bench"]["sets"][wildcards.set])


def bench_drafter_name(wildcards):
    return "none" if wildcards.chain == "baseline" else config["bench"]["drafter_name"]


def bench_job_cores():
    """Cores a bench job claims: when exclusive, every core of this machine (Snakemake caps it
    at --cores), so timings measure the engine and not contention; else its torch threads.
    """
    b = config["bench"]
    return max(b["threads"], os.cpu_count() or 1) if b["exclusive"] else b["threads"]


def bench_drafter_dir(wildcards):
    return (
        None
        if wildcards.chain == "baseline"
        else config["bench"]["drafter"].rstrip("/")
    )


rule bench:
    """Decode one benchmark set with one chain (or no drafter); one row per request."""
    input:
        unpack(bench_inputs),
    output:
        "results/bench/{set}/{chain}.jsonl",
    log:
        "logs/bench/{set}/{chain}.log",
    wildcard_constraints:
        set="|".join(bench_set_names()),
        chain="baseline|[0-9]+-[0-9]+-[0-9]+",
    threads: bench_job_cores()
    resources:
        gpu=device_gpus(config["bench"]["device"]),
        mem_mb=4000,
        runtime=60,
    params:
        set_spec=bench_set_spec,
        drafter_dir=bench_drafter_dir,
        drafter_name=bench_drafter_name,
        backend=config["bench"]["backend"],
        max_new_tokens=config["bench"]["max_new_tokens"],
        dtype=config["bench"]["dtype"],
        device=config["bench"]["device"],
        threads=config["bench"]["threads"],
    script:
        "../scripts/bench.py"
