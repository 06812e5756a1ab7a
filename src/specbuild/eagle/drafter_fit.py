"""Does a drafter folder fit the target? Checked when the workflow is parsed, and again by the
bench job that loads it.

Contract: `fit_faults` compares a drafter's config.json with the target's config.json (hidden
size, target vocabulary, draft vocabulary, the layers its eagle_config makes SGLang capture)
and returns one line per mismatch, plus the target layer-output ids SGLang feeds it.
`external_drafter_faults` runs that for each `bench.drafters.<name>` entry, a folder built
elsewhere, before any job starts: a folder that is missing, has no config.json, whose
model.safetensors is truncated or has an unsound header (specbuild.infra.safetensors_header),
whose tensors are not those its config.json implies (a renamed, missing or extra tensor, by
name, or a shape; specbuild.eagle.drafter_tensors), or that was trained for another target is a
config fault naming the key and the file, not a stack trace from the bench job hours later. The
target's config.json is the materialized folder's (results/target/<name>/), else the source's
when it is a local folder; a hub id not yet downloaded leaves the fit to the bench job, and the
fault list says so only if it finds one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specbuild.eagle.drafter_tensors import (
    IGNORED,
    DrafterShape,
    is_mla,
    silent_losses,
    tensor_names,
    tensor_shapes,
)
from specbuild.infra.formats import DRAFTER_FILES
from specbuild.infra.safetensors_header import header_faults, header_shapes

__all__ = [
    "fit_faults",
    "target_config_for",
    "external_drafter_faults",
    "tensor_faults",
]

WEIGHTS = "model.safetensors"  # of DRAFTER_FILES, the one whose header is read at parse time
# Said after the faults of a folder built elsewhere: retraining ours cannot fix it.
FOREIGN_ADVICE = (
    "point it at an EAGLE-3 drafter trained for this target, or remove the entry "
    "(a folder built elsewhere is not rebuilt by this workflow)"
)


def fit_faults(
    drafter: Mapping[str, Any], target: Mapping[str, Any]
) -> tuple[list[str], list[int] | None]:
    """(mismatches of a drafter's config.json with the target's, the target layer-output ids
    SGLang feeds the drafter or None when its eagle_config's ids are unusable)."""
    from specbuild.eagle.layers import architecture_of, default_layer_ids, output_layer_ids
    from specbuild.eagle.text_model import text_config

    text = text_config(target)
    layers, hidden, vocab = (
        int(text[k]) for k in ("num_hidden_layers", "hidden_size", "vocab_size")
    )
    faults = []
    eagle = (drafter.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    layer_ids: list[int] | None
    if eagle is None:
        layer_ids = default_layer_ids(layers)  # SGLang then captures its model's default
    elif (
        not isinstance(eagle, list)
        or len(eagle) != 3
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in eagle)
    ):
        faults.append(f"eagle_config.eagle_aux_hidden_state_layer_ids is {eagle!r}, not 3 ids")
        layer_ids = None
    else:
        layer_ids = output_layer_ids(architecture_of(target), list(eagle), layers)
        if not all(0 <= i < layers for i in layer_ids):
            faults.append(
                f"aux layer ids {eagle} outside the target's {layers} layers (SGLang would "
                f"capture layer outputs {layer_ids})"
            )
            layer_ids = None
    # target_hidden_size: what its fc layer takes (3 x this); hidden_size its own width, which
    # EAGLE-3 drafters keep equal to the target's where they give no target_hidden_size
    width = drafter.get("target_hidden_size", drafter.get("hidden_size"))
    key = "target_hidden_size" if "target_hidden_size" in drafter else "hidden_size"
    if width is not None and width != hidden:
        faults.append(f"{key} is {width}, the target has {hidden}")
    if drafter.get("vocab_size", vocab) != vocab:
        faults.append(f"vocab_size is {drafter['vocab_size']}, the target has {vocab}")
    draft = drafter.get("draft_vocab_size")
    if isinstance(draft, int) and not 0 < draft <= vocab:
        faults.append(f"draft_vocab_size is {draft}: not within the target's vocabulary ({vocab})")
    return faults, layer_ids


_LISTED = 5  # tensor names or shapes listed per fault; the rest counted


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_LISTED])
    return shown + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")


def tensor_faults(config: Mapping[str, Any], weights: str | os.PathLike) -> list[str]:
    """The tensors of an EAGLE-3 drafter's `weights` (a safetensors file whose header is sound)
    against those its `config` (config.json) implies: missing and unexpected names, then
    shapes where it gives every size (SGLang defaults the others as a Llama config does). []
    for a folder whose architecture is no EAGLE-3 one (its own loader checks it)."""
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and not any("Eagle3" in str(a) for a in archs):
        return []
    names = tensor_names(fc_norm=bool(config.get("fc_norm", False)), mla=is_mla(config))
    try:
        want: dict[str, list[int] | None] = tensor_shapes(DrafterShape.from_config(config))
    except (KeyError, TypeError, ValueError, ArithmeticError):
        want = dict.fromkeys(names)
    have = header_shapes(weights)
    missing = sorted(want.keys() - have.keys())
    extra = sorted(have.keys() - want.keys() - set(IGNORED))
    faults = []
    if missing:
        faults.append(f"no tensor {_listed(missing)}, which its config.json implies")
        why = silent_losses(config, have.keys())
        faults += [f"no tensor {n!r}: {why[n]}" for n in missing if n in why]
    if extra:
        faults.append(
            f"unexpected tensor {_listed(extra)} (SGLang skips a name it does not know and "
            "serves what it did not load untrained; the PyTorch engine refuses the folder)"
        )
    if faults:
        return faults
    wrong = [n for n in want if want[n] is not None and have[n] != want[n]]
    return [
        f"tensor {n!r} has shape {have[n]}, its config.json implies {want[n]}"
        for n in wrong[:_LISTED]
    ] + ([f"... and {len(wrong) - _LISTED} more shapes"] if len(wrong) > _LISTED else [])


def _built_from(folder: Path) -> str | None:
    """The target.source a materialized folder was built from (its fingerprint.json), if any:
    a folder of an earlier source must not stand for the config's target."""
    try:
        return json.loads((folder / "fingerprint.json").read_text(encoding="utf-8"))["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def target_config_for(
    workdir: str | os.PathLike, name: str, source: str
) -> tuple[dict | None, str]:
    """(the target's config.json or None, where it was read or why not)."""
    workdir = Path(workdir)
    built = workdir / "results" / "target" / name
    candidates = [built / "config.json"] if _built_from(built) == source else []
    if not source.startswith("gguf:"):
        candidates.append(workdir / source / "config.json")
    for path in candidates:
        if path.is_file():
            try:
                return json.loads(path.read_text(encoding="utf-8")), str(path)
            except (OSError, ValueError):
                continue
    return None, (
        f"the target ({source}) is not materialized yet, so only the folder and its "
        "config.json are checked now; hidden size, vocabulary and layer ids are checked by "
        "the bench job"
    )


def external_drafter_faults(
    drafters: Mapping[str, Any], *, workdir: str | os.PathLike, target_name: str, source: str
) -> list[str]:
    """One 'bench.drafters.<name>: ...' line per fault of the folders built elsewhere."""
    workdir = Path(workdir)
    target, where = None, ""
    faults: list[str] = []
    for name, folder in drafters.items():
        if not isinstance(folder, str):
            continue  # a type fault, the schema's
        key = f"bench.drafters.{name}"
        full = workdir / folder
        if not full.is_dir():
            what = "is a file, not a folder" if full.exists() else "no such folder"
            faults.append(f"{key}: {what} {folder!r} (in {workdir.resolve()}); {FOREIGN_ADVICE}")
            continue
        missing = [f for f in DRAFTER_FILES if not (full / f).is_file()]
        if missing:
            faults.append(
                f"{key}: {folder!r} has no {' or '.join(missing)}: not an EAGLE-3 folder "
                f"SGLang loads; {FOREIGN_ADVICE}"
            )
            continue
        broken = header_faults(full / WEIGHTS)
        if broken:
            faults.append(f"{key}: {folder}/{WEIGHTS}: {'; '.join(broken)}; {FOREIGN_ADVICE}")
            continue
        try:
            cfg = json.loads((full / "config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            faults.append(f"{key}: {folder}/config.json is not readable JSON ({err})")
            continue
        if not isinstance(cfg, dict):
            faults.append(f"{key}: {folder}/config.json holds no JSON object")
            continue
        wrong = tensor_faults(cfg, full / WEIGHTS)
        if wrong:
            faults.append(f"{key}: {folder}/{WEIGHTS}: {'; '.join(wrong)}; {FOREIGN_ADVICE}")
            continue
        if not where:
            target, where = target_config_for(workdir, target_name, source)
        if target is None:
            continue
        found, _ = fit_faults(cfg, target)
        if found:
            faults.append(
                f"{key}: {folder} does not fit the target (config.json of {where}): "
                + "; ".join(found)
                + f"; {FOREIGN_ADVICE}"
            )
    if faults and target is None and where:
        faults.append(f"bench.drafters: {where}")
    return faults
