"""What a training job reads: its variant's shards, held-out shards, warm start, hparams;
and the draft vocabulary it trains with, with the datasets that vocabulary counts."""

from __future__ import annotations

from collections.abc import Mapping

from specbuild.config import train_datasets
from specbuild.config.views import BLOCK_KEYS, TRAIN_CADENCE, TRAIN_NEUTRAL
from specbuild.workflow.paths import HIDDEN_SHARD, drafter_folder_files
from specbuild.workflow.shards import ShardIndex

__all__ = [
    "eval_set_shards",
    "train_cadence",
    "train_hparams",
    "train_init_files",
    "variant_files",
    "variant_shards",
    "vocab_datasets",
    "vocab_file",
    "vocab_stats_file",
]

SHARED_VOCAB = "results/vocab/vocab.safetensors"


def train_hparams(variants: Mapping[str, Mapping], variant: str) -> dict:
    """Every training hyper-parameter of a variant (schema defaults filled in), as one plain
    dict: a variant's jobs rerun when its own keys or the base recipe's change. Its
    `datasets` are its input shards (`variant_shards`), not a trainer setting; how often it
    logs and checkpoints (TRAIN_CADENCE) changes no output: `train_cadence`. A TRAIN_NEUTRAL
    key at its neutral value is left out (the trainer's default is that value), and so are an
    EAGLE-3 variant's block keys (BLOCK_KEYS), which it never reads."""
    train = variants[variant]
    eagle = train.get("family", "eagle3") == "eagle3"
    return {
        k: v
        for k, v in train.items()
        if k != "datasets"
        and k not in TRAIN_CADENCE
        and not (k in TRAIN_NEUTRAL and v == TRAIN_NEUTRAL[k])
        and not (eagle and k in BLOCK_KEYS)
    }


def train_cadence(variants: Mapping[str, Mapping], key: str, variant: str) -> str:
    """A TRAIN_CADENCE key of a variant, a resource of its train job: a change reruns nothing."""
    if key not in TRAIN_CADENCE:
        raise ValueError(f"{key}: not a cadence key ({', '.join(TRAIN_CADENCE)})")
    return str(variants[variant][key])


def variant_files(
    config: Mapping, shards: ShardIndex, variants: Mapping[str, Mapping], pattern: str, variant: str
) -> list[str]:
    """`pattern` ({dataset}, {shard}) over every shard of the datasets a variant trains on."""
    return shards.expand(pattern, train_datasets(config, variants[variant]))


def variant_shards(
    config: Mapping, shards: ShardIndex, variants: Mapping[str, Mapping], variant: str
) -> list[str]:
    """Hidden shards of the datasets a variant trains on (train.datasets)."""
    return variant_files(config, shards, variants, HIDDEN_SHARD, variant)


def train_init_files(variants: Mapping[str, Mapping], variant: str) -> list[str]:
    """The drafter folder init_from warm-starts from: its files rerun train when changed."""
    folder = variants[variant]["init_from"].rstrip("/")
    return drafter_folder_files(folder) if folder else []


def vocab_datasets(config: Mapping) -> list[str]:
    """The datasets the base recipe trains on (train.datasets; default every one but the
    held-out train.eval_set): the shared draft vocabulary counts these only, so a variant
    training on more data (a multi-turn set, say) adds its jobs and reruns none of the base's.
    """
    return train_datasets(config, config["train"])


def vocab_file(config: Mapping, variants: Mapping[str, Mapping], variant: str) -> str:
    """The draft vocabulary a variant trains and drafts with: the shared one, counted on the
    base recipe's datasets, or, for a variant that trains on other datasets, its own counted
    on those (rule variant_vocab). A lever that changes the data is then measured as the
    recipe it would become: tokens only its data holds get draft ids."""
    if set(train_datasets(config, variants[variant])) == set(vocab_datasets(config)):
        return SHARED_VOCAB
    return f"results/vocab/{variant}/vocab.safetensors"


def vocab_stats_file(config: Mapping, variants: Mapping[str, Mapping], variant: str) -> str:
    """The coverage numbers of the vocabulary `vocab_file` gives the variant, counted on the
    datasets it trains on."""
    return vocab_file(config, variants, variant).replace("vocab.safetensors", "vocab_stats.json")


def eval_set_shards(config: Mapping, shards: ShardIndex) -> list[str]:
    """Hidden shards of train.eval_set, whose simulated acceptance picks the best epoch."""
    held_out = config["train"]["eval_set"]
    if held_out is None:
        return []
    return shards.expand(HIDDEN_SHARD, [held_out])
