"""Helpers for the rules: config validation, path helpers, params as plain builtins."""

import os
import sys

from specbuild.config import (
    ConfigError,
    bench_drafter_names,
    check_config,
    sglang_server_args,
    train_datasets,
    train_variants,
)
from specbuild.engine_memory import without_memory
from specbuild.formats import GENERATED_ROWS, SAMPLE_ROWS, TOKENIZED_ROWS
from specbuild.gpus import train_slots
from specbuild.rejects import check_rejected_share
from specbuild.samples import record_digests


def config_source():
    """The config as given, for messages: its file(s) and the keys --config overrides."""
    files = [os.path.relpath(f) for f in workflow.overwrite_configfiles]
    given = " + ".join(files or ["config/config.yaml"])
    overrides = ", ".join(workflow.config_settings.config)
    return f"{given} with --config {overrides}" if overrides else given


SCHEMA = f"{workflow.basedir}/config/config.schema.yaml"

# Fills the schema's defaults; one short error naming every faulty key. Exiting with the message
# alone: Snakemake prints a raised error inside "in file common.smk, line N" and a traceback line,
# which point at this check, not at the user's config.
try:
    check_config(config, schema=SCHEMA, source=config_source())
except ConfigError as err:
    sys.exit(str(err))


wildcard_constraints:
    dataset="[A-Za-z0-9_]+",
    shard="[0-9]{5}",
    variant="[A-Za-z0-9_]+",


TARGET = config["target"]["name"]


def target_file(name):
    """A file of the materialized target folder."""
    return f"results/target/{TARGET}/{name}"


# results/ may be a symlink to a larger disk (specbuild/snakemake_symlinks.py says why this is
# needed).
from specbuild.snakemake_symlinks import keep_linked_output_folders

keep_linked_output_folders()

# A lock left here: say what is safe before Snakemake's own advice (`--unlock`), which is not
# under a live run. A job of a run (its own parse) does not ask.
from specbuild.run_lock import lock_advice

if workflow.is_main_process:
    advice = lock_advice()
    if advice:
        print(advice, file=sys.stderr)


def dataset_config(dataset):
    return config["datasets"][dataset]


def raw_dataset_path(wildcards):
    return dataset_config(wildcards.dataset)["path"]


def is_synthetic(dataset):
    """A dataset whose user prompts the target writes itself (`synthesize`), not a file."""
    return "synthesize" in dataset_config(dataset)


def datasets_regex(synthetic):
    """Wildcard constraint for the rule that builds samples of file or of synthetic datasets."""
    names = [d for d in config["datasets"] if is_synthetic(d) == synthetic]
    return "|".join(names) if names else "(?!)"  # (?!) matches nothing


def synthesize_sampling(wildcards):
    """SamplingParams fields of the self-written prompts; request i is seeded seed + i."""
    cfg = dataset_config(wildcards.dataset)["synthesize"]
    return {
        "max_new_tokens": cfg["max_tokens"],
        "temperature": cfg["temperature"],
        "top_p": cfg["top_p"],
        "seed": cfg["seed"],
    }


def conversation_turns(wildcards):
    """Answers per conversation: `synthesize.turns` of a self-written dataset, else 1."""
    if not is_synthetic(wildcards.dataset):
        return 1
    return dataset_config(wildcards.dataset)["synthesize"]["turns"]


def follow_up_sampling(wildcards):
    """SamplingParams fields of the follow-up user turns the target writes (turns > 1): the
    dataset's synthesize settings. {} when there are none, so their changes rerun nothing.
    """
    if conversation_turns(wildcards) == 1:
        return {}
    return synthesize_sampling(wildcards)


def dataset_param(key):
    """An input function returning one key of the dataset's config (schema fills defaults)."""

    def get(wildcards):
        return dataset_config(wildcards.dataset)[key]

    get.__name__ = f"dataset_{key}"
    return get


# Job order where cores are scarce: Snakemake starts the ready job of highest priority (then
# of largest input). On a 2-core `make run`, decoding is the longest chain: the reject checks
# (a JSON read each, gating the next stage) go first, then `synthesize` (every chat `generate`
# waits for the earlier shards' prompts: near-duplicates), `samples` and `generate`, then
# `tokenize` (seconds; it gates hidden), the bench (its baseline needs only the target and
# fills the gaps in decoding; run last it would hold a core while `train` waits for both),
# then hidden (largest input first: the longest shards, so the last ones end together) and
# the rest (0). Without it the baseline (the largest inputs) started first and the first
# self-written shard 185 s late (BENCHMARKS.md, "CPU pipeline").
PRIORITY = {"check_rejects": 5, "synthesize": 4, "decode": 3, "tokenize": 2, "bench": 1}


def device_gpus(device):
    """GPUs a job asks the scheduler for: only `cuda` demands one; `auto` uses one if present."""
    return 1 if device == "cuda" else 0


# {variant: its whole train config}: `base` (train as given) and each of train.variants
VARIANTS = train_variants(config)


def variant_train(wildcards):
    return VARIANTS[wildcards.variant]


def train_gpus(wildcards):
    """GPU slots of a train job: a majority of a GPU's SPECBUILD_GPU_SLOTS slots per DDP
    process on CUDA (train.nproc of its variant), so no two trainings share a GPU."""
    train = variant_train(wildcards)
    return train["nproc"] * device_gpus(train["device"]) * train_slots()


def train_hparams(wildcards):
    """Every training hyper-parameter of the job's variant (schema defaults filled in), as one
    plain dict: a variant's jobs rerun when its own keys or the base recipe's change. Its
    `datasets` are its input shards (`variant_shards`), not a trainer setting."""
    return {k: v for k, v in variant_train(wildcards).items() if k != "datasets"}


def variant_shards(wildcards):
    """Hidden shards of the datasets the job's variant trains on (train.datasets)."""
    return per_shard(
        "results/hidden/{dataset}/{shard}.safetensors",
        train_datasets(config, variant_train(wildcards)),
    )


def engine_env(backend):
    """The conda environment (--sdm conda) of a job running `backend`: SGLang pins its own
    torch and transformers, so its jobs get envs/sglang.yaml, every other job the default.
    """
    return "../envs/sglang.yaml" if backend == "sglang" else "../envs/specbuild.yaml"


def train_init_files(wildcards):
    """The drafter folder init_from warm-starts from: its files rerun train when changed."""
    folder = variant_train(wildcards)["init_from"].rstrip("/")
    return [f"{folder}/config.json", f"{folder}/model.safetensors"] if folder else []


def drafter_files(variant):
    """The exported drafter folder of a variant (what SGLang loads)."""
    return [
        f"results/drafter/{variant}/config.json",
        f"results/drafter/{variant}/model.safetensors",
    ]


def generate_gpus():
    if config["generate"]["backend"] == "openai":
        return 0  # the endpoint's GPUs are not ours to schedule
    if config["generate"]["backend"] == "sglang":
        return sglang_gpus()
    return device_gpus(config["generate"]["device"])


def generate_backend_args():
    """Constructor kwargs of the configured generation backend, as plain builtins."""
    gen = config["generate"]
    if gen["backend"] == "hf":
        return {
            "target_dir": f"results/target/{TARGET}",
            "dtype": gen["dtype"],
            "device": gen["device"],
            "batch_size": gen["batch_size"],
        }
    return sglang_backend_args(gen["backend"])


def sampling_params(wildcards):
    """SamplingParams fields; the seed is offset per shard so shards sample independently."""
    gen = config["generate"]
    own = dataset_config(wildcards.dataset).get("max_new_tokens")
    return {
        "max_new_tokens": gen["max_new_tokens"] if own is None else own,
        "temperature": gen["temperature"],
        "top_p": gen["top_p"],
        "seed": gen["seed"] + int(wildcards.shard),
    }


def dataset_size_limit(dataset):
    """Records used: `limit` (null: all) of a file, `synthesize.count` of a synthetic dataset."""
    cfg = dataset_config(dataset)
    return cfg["synthesize"]["count"] if is_synthetic(dataset) else cfg["limit"]


def _shard_digests(dataset):
    # Content digest of each shard's raw slice: a shard reruns only when its own records
    # change, never because records were appended after it. A synthetic shard has no raw
    # records: its index range (and its params) say everything.
    cfg, limit = dataset_config(dataset), dataset_size_limit(dataset)
    if is_synthetic(dataset):
        size = cfg["shard_size"]
        return [f"synthetic {a}-{min(a + size, limit)}" for a in range(0, limit, size)]
    return record_digests(
        cfg["path"], shard_size=cfg["shard_size"], limit=limit, id_key=cfg["id_key"]
    )


def _all_digests():
    """Shard digests of every dataset. A file that cannot be read or holds no record is a
    config fault naming its key, like the schema's, not a stack trace."""
    digests, faults = {}, []
    for name in config["datasets"]:
        try:
            digests[name] = _shard_digests(name)
        except (OSError, ValueError) as err:
            faults.append(f"datasets.{name}.path: {err}")
            continue
        if not digests[name] and not is_synthetic(name):
            path = dataset_config(name)["path"]
            faults.append(f"datasets.{name}.path: {path!r} holds no records")
    if faults:
        raise ConfigError(config_source(), faults, SCHEMA).with_traceback(None)
    return digests


_DIGESTS = _all_digests()


def shard_ids(dataset):
    return [f"{i:05d}" for i in range(len(_DIGESTS[dataset]))]


def shard_digest(wildcards):
    return _DIGESTS[wildcards.dataset][int(wildcards.shard)]


def shard_range(wildcards):
    """[start, stop) record indices of a shard; the last shard stops at the dataset's limit."""
    size = dataset_config(wildcards.dataset)["shard_size"]
    limit = dataset_size_limit(wildcards.dataset)
    start = int(wildcards.shard) * size
    return [start, start + size if limit is None else min(start + size, limit)]


def earlier_samples(wildcards):
    """The samples shards before this one of its dataset, which near-duplicate removal checks
    this shard's prompts against ([] when it is off). Each shard reads only earlier ones, so
    appending records never reruns a shard (the DAG holds k inputs for shard k)."""
    if dataset_config(wildcards.dataset)["near_duplicate_threshold"] is None:
        return []
    before = shard_ids(wildcards.dataset)[: int(wildcards.shard)]
    return [f"results/samples/{wildcards.dataset}/{s}.jsonl" for s in before]


def per_shard(pattern, datasets=None):
    """Expand a results pattern over every (dataset, shard) of `datasets` (default: all)."""
    return [
        pattern.format(dataset=d, shard=s)
        for d in (config["datasets"] if datasets is None else datasets)
        for s in shard_ids(d)
    ]


def vocab_datasets():
    """The datasets the base recipe trains on (train.datasets; default every one but the
    held-out train.eval_set): the shared draft vocabulary counts these only, so a variant
    training on more data (a multi-turn set, say) adds its jobs and reruns none of the base's.
    """
    return train_datasets(config, config["train"])


def eval_set_shards():
    """Hidden shards of train.eval_set, whose simulated acceptance picks the best epoch."""
    held_out = config["train"]["eval_set"]
    if held_out is None:
        return []
    return per_shard("results/hidden/{dataset}/{shard}.safetensors", [held_out])


# Results folders whose shards carry rejected rows, and the config section of each limit.
REJECT_STAGES = {"samples": "samples", "generated": "generate", "tokenized": "tokenize"}


def reject_limit(stage, dataset):
    """The rejected-share limit of one stage's shards of a dataset and the key that sets it."""
    if stage == "samples" and is_synthetic(dataset):
        return {
            "limit": dataset_config(dataset)["synthesize"]["max_rejected_fraction"],
            "setting": f"datasets.{dataset}.synthesize.max_rejected_fraction",
        }
    section = REJECT_STAGES[stage]
    return {
        "limit": config[section]["max_rejected_fraction"],
        "setting": f"{section}.max_rejected_fraction",
    }


def reject_limits():
    """Every limit, by "{stage}/{dataset}": the params of the reject table."""
    return {
        f"{stage}/{dataset}": reject_limit(stage, dataset)
        for stage in REJECT_STAGES
        for dataset in config["datasets"]
    }


def reject_counts_files():
    return [
        f
        for stage in REJECT_STAGES
        for f in per_shard(f"results/{stage}/{{dataset}}/{{shard}}.counts.json")
    ]


def aux_layer_ids():
    """hidden.layer_ids as configured: [] means the EAGLE-3 default, resolved at run time.

    Resolving [1, L//2-1, L-4] here would need the target's config.json, which does not exist
    at the first parse; the params would change between that parse and the next and rerun every
    hidden job. Passing the configured value keeps params stable; the job resolves it from
    fingerprint.json (an input, so a new target reruns it) and records the ids in the shard.
    """
    return list(config["hidden"]["layer_ids"])


def hidden_gpus():
    if config["hidden"]["backend"] == "sglang":
        return sglang_gpus()  # the serving engine runs on GPUs whatever `device` says
    return device_gpus(config["hidden"]["device"])


def hidden_backend_options():
    """Engine settings of the feature backend (server flags for sglang; hf needs none)."""
    return sglang_feature_args() if config["hidden"]["backend"] == "sglang" else {}


def sglang_gpus():
    """GPUs one SGLang server takes: its tensor-parallel size (`tp_size` or `tp`)."""
    args = config["sglang"]["server_args"]
    return int(args.get("tp_size") or args.get("tp") or 1)


def sglang_server_options():
    """The fields of `ServerOptions` (backends/server.py), shared by every SGLang server
    specbuild starts, as plain builtins: jobs rebuild it whole from this one param."""
    sg = config["sglang"]
    return {
        "launcher": list(sg["launcher"]),
        "server_args": sglang_server_args(config),
        "env": {k: str(v) for k, v in sg["env"].items()},
        "host": sg["host"],
        "startup_timeout_s": sg["startup_timeout_s"],
        "request_timeout_s": sg["request_timeout_s"],
        "draft_attention_backend": sg["draft_attention_backend"],
    }


def sglang_backend_args(backend):
    """Constructor kwargs of the sglang/openai generation backend. Only the *name* of the
    API key's environment variable goes into params (they are stored in Snakemake metadata).
    """
    sg = config["sglang"]
    common = {
        "max_concurrency": sg["max_concurrency"],
        "request_timeout_s": sg["request_timeout_s"],
    }
    if backend == "openai":  # the config check makes sure the endpoint is set
        return {
            "base_url": sg["endpoint"],
            "model": sg["served_model"],
            "api_key_env": sg["api_key_env"],
            **common,
        }
    server = sglang_server_options()
    # request_timeout_s comes with `common`, where generate's params have always had it
    del server["request_timeout_s"]
    del server["draft_attention_backend"]  # generation serves no drafter
    return {"target_dir": f"results/target/{TARGET}", **server, **common}


def sglang_feature_args():
    """Keyword options of the in-process sglang feature backend (stages hidden and align),
    less its memory settings: those are the job's `engine_memory` resource."""
    sg = config["sglang"]
    return {
        "server_args": without_memory(sglang_server_args(config)),
        "env": {k: str(v) for k, v in sg["env"].items()},
    }


def feature_engine_memory(backend):
    """sglang.hidden.mem_fraction_static as a resource of a feature job ("" for hf): it sizes
    the KV pool and changes no output, so a change must not rerun finished shards."""
    if backend != "sglang":
        return ""
    return str(config["sglang"]["hidden"]["mem_fraction_static"])


def all_outputs():
    return (
        per_shard("results/hidden/{dataset}/{shard}.safetensors")
        + ["results/vocab/vocab.safetensors", "results/align/report.json"]
        + ["results/tables/rejects.md"]
        + [f for variant in VARIANTS for f in drafter_files(variant)]
        + ["results/tables/variants.md"]
        + report_outputs()
        + ["results/serve.sh"]
    )
