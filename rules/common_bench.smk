"""Helpers for the rules that measure: align, bench, the serving bench, tuning and report.

Split from common.smk (validation, datasets, shards, engines), which the Snakefile includes
just before this file; both define plain functions for params and inputs. Chains that the
engines cannot run are config faults (specbuild.config_check), caught at parse time.
"""

import os

# Align, serving bench and tuning (rules/align.smk, rules/tuning.smk).


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


def serving_drafter_files():
    """The exported drafter the servers load: the same folder the PyTorch bench loads."""
    return bench_drafter_files()


def serving_drafter_name():
    return config["bench"]["drafter_name"]


def serving_chains():
    """Server configs of the serving bench: the baseline (if on) and every chain."""
    b = config["sglang"]["bench"]
    return (["baseline"] if b["baseline"] else []) + list(b["chains"])


def serving_bench_inputs(wildcards):
    inputs = {"fp": target_file("fingerprint.json")}
    if wildcards.chain != "baseline":
        inputs["drafter"] = serving_drafter_files()
    return inputs


def serving_sets():
    return {
        name: dict(spec) for name, spec in config["sglang"]["bench"]["sets"].items()
    }


def tuning_inputs(wildcards):
    inputs = {
        "fp": target_file("fingerprint.json"),
        "help": "results/tuning/launch_server.help.txt",
    }
    if config["sglang"]["tuning"]["chain"] != "baseline":
        inputs["drafter"] = serving_drafter_files()
    return inputs


def tuning_point_args(wildcards):
    return dict(
        config["sglang"]["tuning"]["points"][wildcards.point].get("server_args", {})
    )


def tuning_point_env(wildcards):
    env = config["sglang"]["tuning"]["points"][wildcards.point].get("env", {})
    return {k: str(v) for k, v in env.items()}


def tuning_prompt_set():
    """The first serving-bench set: its first turns are the tuning prompts."""
    return dict(next(iter(config["sglang"]["bench"]["sets"].values())))


def serving_outputs():
    """Tables and plots of the serving bench and the tuning sweep, when enabled."""
    out = []
    if config["sglang"]["bench"]["enabled"]:
        out += [
            "results/tables/bench_sglang.md",
            "results/plots/bench_sglang_throughput.png",
        ]
    if config["sglang"]["tuning"]["enabled"] and config["sglang"]["tuning"]["points"]:
        out += ["results/tables/tuning.md", "results/plots/tuning.png"]
    return out


# Bench and report helpers (rules/bench.smk, rules/report.smk).


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
        else bench_drafter_files()[0].rsplit("/", 1)[0]
    )


BENCH_TABLES = ["bench", "positions", "train_vs_bench"]
BENCH_PLOTS = ["acceptance_length", "acceptance_by_position", "speedup"]


def report_tables_inputs(wildcards):
    """Every bench row file, plus training's metrics when the report compares against them."""
    inputs = {"rows": bench_row_files()}
    if config["report"]["train_metrics"]:
        inputs["train"] = config["report"]["train_metrics"]
    return inputs


def bench_outputs():
    """Everything the report shows: each table in three formats and each plot."""
    if not config["bench"]["enabled"]:
        return []
    return [
        f"results/tables/{t}.{ext}"
        for t in BENCH_TABLES
        for ext in ("csv", "md", "html")
    ] + [f"results/plots/{p}.png" for p in BENCH_PLOTS]


def serve_summaries():
    """Serving-bench summaries `make serve` picks its chain from (none when the bench is off)."""
    if not config["sglang"]["bench"]["enabled"]:
        return []
    return expand(
        "results/bench_sglang/{chain}.summary.json",
        chain=config["sglang"]["bench"]["chains"],
    )
