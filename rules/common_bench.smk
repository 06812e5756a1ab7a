"""Helpers for the rules that measure and report: align, bench, tuning, serve and report.

Split from common.smk (validation, datasets, shards, engines), which the Snakefile includes
just before this file; both define plain functions for params and inputs. Chains that the
engines cannot run are config faults (specbuild.config), caught at parse time.
"""

import os

from specbuild.chain import BASELINE, CONFIG_PATTERN, NO_DRAFTER

# Align (rules/align.smk).


def align_shards():
    """The first hidden shard of each dataset but those only variants train on: a fixed sample
    that appending data never moves, and that a variant's own data (extracted by the same
    backend) never reruns, since every variant's training waits for this check."""
    variant_only = {
        d
        for name, train in VARIANTS.items()
        for d in train_datasets(config, train)
        if name != "base"
    } - set(vocab_datasets())
    return [
        f"results/hidden/{d}/{shard_ids(d)[0]}.safetensors"
        for d in config["datasets"]
        if shard_ids(d) and d not in variant_only
    ]


def align_backend_options():
    """Engine settings of the serving feature backend; hf needs none beyond dtype/device."""
    return sglang_feature_args() if config["align"]["backend"] == "sglang" else {}


def align_gpus():
    if config["align"]["backend"] == "sglang":
        return sglang_gpus()
    return device_gpus(config["align"]["device"])


# Bench (rules/bench.smk): one job per engine, drafter and config, every set in it. A drafter
# is one of our variants (bench.variants) or one built elsewhere (bench.drafters); the baseline
# has none: results/bench/{engine}/none/baseline.jsonl, once per engine.

SERVED_ENGINES = ("sglang", "openai")


def bench_engines():
    return list(config["bench"]["engines"]) if config["bench"]["enabled"] else []


def bench_drafters():
    """{name: exported folder} of every drafter the hf and sglang engines bench, ours first."""
    folders = {v: f"results/drafter/{v}" for v in VARIANTS}
    folders |= {k: os.path.normpath(v) for k, v in config["bench"]["drafters"].items()}
    return {name: folders[name] for name in bench_drafter_names(config)}


def bench_runs(engine):
    """(drafter, config) pairs one engine is benched at: the baseline (if on) and each drafter
    at every chain; an existing endpoint (openai) only at what it serves."""
    b = config["bench"]
    if engine == "openai":
        serves = b["openai"]["serves"]
        return [(NO_DRAFTER if serves == BASELINE else b["openai"]["drafter"], serves)]
    runs = [(NO_DRAFTER, BASELINE)] if b["baseline"] else []
    return runs + [(d, c) for d in bench_drafters() for c in b["chains"]]


def bench_row_file(engine, drafter, chain):
    return f"results/bench/{engine}/{drafter}/{chain}.jsonl"


def bench_row_files():
    return [bench_row_file(e, d, c) for e in bench_engines() for d, c in bench_runs(e)]


def bench_drafter_files(drafter):
    """The files of a drafter's folder (our variant's: its export rule's outputs)."""
    folder = bench_drafters().get(drafter, f"results/drafter/{drafter}")
    return [f"{folder}/config.json", f"{folder}/model.safetensors"]


def bench_drafter_regex():
    """Wildcard constraint of `drafter`: the baseline's `none` or a benched drafter's name."""
    names = [NO_DRAFTER, *bench_drafters()]
    if "openai" in bench_engines():
        names.append(config["bench"]["openai"]["drafter"])
    return "|".join(dict.fromkeys(names))


def variant_bench_rows():
    """Row files of our benched variants by the engines that count verify steps (hf, sglang),
    at every chain: the measured columns of the variants table."""
    return [
        bench_row_file(e, d, c)
        for e in bench_engines()
        if e != "openai"
        for d, c in bench_runs(e)
        if d in VARIANTS
    ]


def bench_inputs(wildcards):
    """Target fingerprint and every set's file; the drafter's files for a chain we serve."""
    if (wildcards.drafter == NO_DRAFTER) != (wildcards.chain == BASELINE):
        raise ValueError(
            f"results/bench/{wildcards.engine}/{wildcards.drafter}/{wildcards.chain}.jsonl: the "
            f"baseline is {NO_DRAFTER}/{BASELINE}.jsonl, a drafter's runs are its chains"
        )
    inputs = {
        "fp": target_file("fingerprint.json"),
        "sets": [s["path"] for s in config["bench"]["sets"].values()],
    }
    if wildcards.chain != BASELINE and wildcards.engine != "openai":
        inputs["drafter"] = bench_drafter_files(wildcards.drafter)
    return inputs


def bench_sets():
    """Every set's config entry as a plain dict (schema defaults filled in), in config order."""
    return {name: dict(spec) for name, spec in config["bench"]["sets"].items()}


def bench_options(wildcards):
    """The engine's own settings (its opener's `options` in specbuild.bench)."""
    b = config["bench"]
    if wildcards.engine == "hf":
        return {k: b["hf"][k] for k in ("dtype", "device", "threads", "workers")}
    if wildcards.engine == "sglang":
        return {"server": sglang_server_options()}
    keys = ("endpoint", "api_key_env", "served_model", "name", "request_timeout_s")
    return {k: b["openai"][k] for k in keys}


def bench_prompt_limit(wildcards):
    return config["bench"]["hf"]["limit"] if wildcards.engine == "hf" else None


def sweeps(engine, drafter):
    """A served engine sweeps concurrency for the baseline and the drafters of
    bench.sweep_drafters (null: all); the hf engine serves one request at a time."""
    swept = config["bench"]["sweep_drafters"]
    chosen = drafter == NO_DRAFTER or swept is None or drafter in swept
    return engine in SERVED_ENGINES and chosen and bool(config["bench"]["concurrency"])


def bench_concurrency(wildcards):
    if sweeps(wildcards.engine, wildcards.drafter):
        return list(config["bench"]["concurrency"])
    return []


def bench_env(wildcards):
    """A sglang job starts its servers with the job's Python: it needs SGLang's env."""
    return engine_env(wildcards.engine)


def bench_gpus(wildcards):
    if wildcards.engine == "hf":
        return device_gpus(config["bench"]["hf"]["device"])
    return sglang_gpus() if wildcards.engine == "sglang" else 0


def bench_threads(wildcards):
    """Cores a job claims. hf with `exclusive`: every core of this machine (Snakemake caps it
    at --cores), so timings measure the engine and not contention; else its processes' torch
    threads. A served engine's job is a client: one core."""
    hf = config["bench"]["hf"]
    if wildcards.engine != "hf":
        return 1
    cores = hf["workers"] * hf["threads"]
    return max(cores, os.cpu_count() or 1) if hf["exclusive"] else cores


# Tuning (rules/tuning.smk) and `make serve` (rules/serve.smk).


def tuning_inputs(wildcards):
    inputs = {
        "fp": target_file("fingerprint.json"),
        "help": "results/tuning/launch_server.help.txt",
    }
    if config["sglang"]["tuning"]["chain"] != BASELINE:
        inputs["drafter"] = bench_drafter_files(served_drafter())
    return inputs


def tuning_point_args(wildcards):
    return dict(
        config["sglang"]["tuning"]["points"][wildcards.point].get("server_args", {})
    )


def tuning_point_env(wildcards):
    env = config["sglang"]["tuning"]["points"][wildcards.point].get("env", {})
    return {k: str(v) for k, v in env.items()}


def tuning_prompt_set():
    """The first bench set: its first turns are the tuning prompts."""
    return dict(next(iter(config["bench"]["sets"].values())))


def tuning_points():
    t = config["sglang"]["tuning"]
    return list(t["points"]) if t["enabled"] else []


def served_drafter():
    """The drafter `make serve` and a tuning chain serve: the first benched one (bench.variants,
    `base` unless it says otherwise); `base`, always built, where none is benched."""
    return next(iter(bench_drafters()), "base")


def serve_rows():
    """The sglang engine's rows of the served drafter at each chain, which `make serve` picks
    the fastest from."""
    if "sglang" not in bench_engines():
        return []
    drafter = served_drafter()
    return [bench_row_file("sglang", drafter, c) for c in config["bench"]["chains"]]


# Report (rules/report.smk): every table (.csv, .md, .html) and plot, flagged for the HTML
# report with its category and caption (report/<name>.rst).


def table(name, category, subcategory):
    """results/tables/<name>.{html,csv,md}; the HTML one in the report, captioned by
    report/<name>_table.rst."""
    caption = f"../report/{name}_table.rst"
    html = f"results/tables/{name}.html"
    flagged = report(html, caption=caption, category=category, subcategory=subcategory)
    return [flagged, f"results/tables/{name}.csv", f"results/tables/{name}.md"]


def plot(name, category, subcategory):
    """results/plots/<name>.png in the report, captioned by report/<name>_plot.rst."""
    caption = f"../report/{name}_plot.rst"
    png = f"results/plots/{name}.png"
    return [report(png, caption=caption, category=category, subcategory=subcategory)]


def bench_report_files():
    """The bench's tables and plots; the sweep's where a served engine sweeps."""
    if not bench_engines():
        return []
    out = table("bench", "Benchmark", "Acceptance")
    out += plot("acceptance", "Benchmark", "Acceptance")
    # acceptance per draft position: the hf engine reports it
    if "hf" in bench_engines() and config["bench"]["chains"]:
        out += table("positions", "Benchmark", "Acceptance")
        out += plot("positions", "Benchmark", "Acceptance")
    if config["report"]["train_metrics"]:
        out += table("train_vs_bench", "Benchmark", "Acceptance")
    out += table("latency", "Benchmark", "Speed")
    out += plot("speedup", "Benchmark", "Speed")
    # only where a job sweeps: a served bench of drafters outside sweep_drafters and no
    # baseline has no sweep rows
    if any(sweeps(e, d) for e in bench_engines() for d, _ in bench_runs(e)):
        out += table("sweep", "Benchmark", "Concurrency")
        out += plot("sweep", "Benchmark", "Concurrency")
    return out


def pipeline_report_files():
    out = table("data", "Data", "Samples and tokens")
    out += table("vocab", "Data", "Vocabulary")
    out += table("align", "Data", "Alignment")
    out += table("disk", "Data", "Disk use")
    if config["report"]["train_metrics"]:
        out += table("train", "Training", "Curves")
        out += plot("train", "Training", "Curves")
    return out


def tuning_report_files():
    if not tuning_points():
        return []
    return table("tuning", "Tuning", "Points") + plot("tuning", "Tuning", "Points")


def bench_report_inputs(wildcards):
    inputs = {"rows": bench_row_files()}
    if config["report"]["train_metrics"]:
        inputs["train"] = config["report"]["train_metrics"]
    return inputs


def pipeline_report_inputs(wildcards):
    inputs = {
        "samples": per_shard("results/samples/{dataset}/{shard}.counts.json"),
        "generated": per_shard("results/generated/{dataset}/{shard}.counts.json"),
        "tokenized": per_shard("results/tokenized/{dataset}/{shard}.meta.json"),
        "hidden": per_shard("results/hidden/{dataset}/{shard}.safetensors"),
        "vocab": "results/vocab/vocab_stats.json",
        "align": "results/align/report.json",
    }
    if config["report"]["train_metrics"]:
        inputs["train"] = config["report"]["train_metrics"]
    return inputs


def train_metrics_variant():
    """The variant whose metrics report.train_metrics names (results/train/<variant>/...), whose
    bench rows train_vs_bench compares; None for metrics trained elsewhere."""
    for variant in VARIANTS:
        if (
            config["report"]["train_metrics"]
            == f"results/train/{variant}/metrics.jsonl"
        ):
            return variant
    return None


def train_curves_dir():
    """TensorBoard events beside the training metrics (rules/train.smk writes both)."""
    metrics = config["report"]["train_metrics"]
    return os.path.join(os.path.dirname(metrics), "tensorboard") if metrics else None


def report_outputs():
    """Everything the HTML report shows, as plain paths: an input flagged report() would take
    its caption relative to the including file (the Snakefile, for `all`), not to rules/.
    """
    files = bench_report_files() + pipeline_report_files() + tuning_report_files()
    return [str(f) for f in files]
