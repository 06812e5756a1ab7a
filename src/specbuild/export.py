"""Stage `export`: the best drafter as a folder SGLang loads with `--speculative-algorithm EAGLE3`.

    config.json        LlamaForCausalLMEagle3 config (Eagle3DeepseekV2ForCausalLM for a
                       drafter with the target's multi-latent attention, its MLA sizes and
                       rope_interleave beside): shapes, draft/target vocab sizes, the target's
                       RoPE and max_position_embeddings, aux layer ids (+ fc_norm, norm_output
                       for EAGLE-3.1)
    model.safetensors  midlayer.*, fc.weight, norm.weight, lm_head.weight, d2t, t2d
                       (+ fc_norm.{0,1,2}.weight for EAGLE-3.1); no embedding (SGLang shares
                       the target's)

The failure guarded: SGLang skips weight names it does not know without a word, and with
`tie_word_embeddings: true` it replaces lm_head by the embedding; either way the server runs a
drafter with random or wrong weights and acceptance collapses. A NaN/Inf weight (a diverged
run, or a float16 export overflowing) serves garbage just as quietly. `check_export` compares
every key, shape and dtype with what the config implies (saying what SGLang would do instead
where it loads a folder without a word: a head it leaves random, an MLA projection it drops),
counts NaN/Inf values, and lists every fault at once; `export_for_sglang` refuses a non-finite
checkpoint before writing anything.
"""

from __future__ import annotations

import logging
import os
from dataclasses import fields
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from specbuild.block_export import (
    block_faults,
    block_hf_config,
    block_tensors,
    config_from_export,
    family_of,
    llama_config,
)
from specbuild.drafter.block import BLOCK_FAMILIES, BlockConfig
from specbuild.drafter.config import DrafterConfig
from specbuild.drafter.state import read_drafter
from specbuild.eagle.drafter_tensors import (
    MLA_ARCHITECTURE,
    MLA_KEYS,
    DrafterShape,
    is_mla,
    silent_losses,
    tensor_shapes,
)
from specbuild.eagle.layers import AUX_LAYERS, architecture_of, eagle_layer_ids
from specbuild.eagle.text_model import text_config
from specbuild.infra.disk import ensure_free_space, export_need
from specbuild.infra.dtypes import DTYPES, HEADER_DTYPES
from specbuild.infra.formats import DRAFTER_FILES
from specbuild.infra.io import atomic_path, read_json, write_json
from specbuild.infra.safetensors_file import save_tensors

__all__ = ["ExportError", "export_for_sglang", "check_export", "export_faults", "hf_config"]

log = logging.getLogger("specbuild")

ARCHITECTURE = "LlamaForCausalLMEagle3"
ALLOWED_EXTRA_FILES = ("README.md", "metrics.json")


class ExportError(ValueError):
    """An exported drafter folder SGLang would load wrongly; the message lists every fault."""


def serving_layer_ids(
    layer_ids: list[int], target_config: dict, recorded: list[int] | None = None
) -> list[int]:
    """The eagle_config ids under which SGLang captures the outputs of `layer_ids`: those the
    hidden stage recorded (checked against the model SGLang loaded, when it extracted), else
    specbuild's reading of SGLang's rule for the target's architecture."""
    if recorded:
        return [int(i) for i in recorded]
    text = text_config(target_config)
    return eagle_layer_ids(
        architecture_of(target_config), layer_ids, int(text["num_hidden_layers"])
    )


def hf_config(
    cfg: DrafterConfig,
    *,
    layer_ids: list[int],
    target_config: dict,
    dtype: str,
    eagle_ids: list[int] | None = None,
) -> dict:
    """The config.json of the exported folder; `eagle_ids` as recorded in the shards."""
    target = text_config(target_config)
    out = llama_config(cfg, dtype=dtype, target=target)
    out |= {
        "architectures": [MLA_ARCHITECTURE if cfg.mla else ARCHITECTURE],
        "num_hidden_layers": 1,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": serving_layer_ids(
                layer_ids, target_config, eagle_ids
            ),
            "use_aux_hidden_state": True,
        },
    }
    if cfg.mla:  # no head_dim: SGLang's MLA reads the nope, rope and v widths
        del out["head_dim"]
        out |= {k: getattr(cfg, k) for k in MLA_KEYS}
        out["rope_interleave"] = cfg.rope_interleave
    if cfg.fc_norm:
        out["fc_norm"] = True
    if cfg.norm_output:
        out["norm_output"] = True
    return out


def expected_tensors(cfg: DrafterConfig, dtype: str) -> dict[str, tuple[list[int], str]]:
    """{name: (shape, safetensors dtype)} of a correct model.safetensors (its names and shapes:
    specbuild.eagle.drafter_tensors, which the parse-time check of a foreign folder reads too)."""
    shape = DrafterShape(**{f.name: getattr(cfg, f.name) for f in fields(DrafterShape)})
    kinds = {"d2t": "I64", "t2d": "BOOL"}
    return {
        name: (dims, kinds.get(name, HEADER_DTYPES[dtype]))
        for name, dims in tensor_shapes(shape).items()
    }


def export_for_sglang(
    *, checkpoint: str | os.PathLike, out_dir: str | os.PathLike, dtype: str = "bfloat16"
) -> None:
    """Write config.json + model.safetensors from a trained drafter checkpoint, then check it."""
    if dtype not in DTYPES:
        raise ValueError(f"export dtype {dtype!r}: choose one of {sorted(DTYPES)}")
    tensors, meta = read_drafter(checkpoint)
    if meta.get("family", "eagle3") in BLOCK_FAMILIES:
        text = text_config(meta["target_config"])
        config = block_hf_config(
            BlockConfig.from_dict(meta["drafter_config"]),
            layer_ids=meta["layer_ids"],
            target_layers=int(text["num_hidden_layers"]),
            dtype=dtype,
            extra=text,
        )
    else:
        config = hf_config(
            DrafterConfig.from_dict(meta["drafter_config"]),
            layer_ids=meta["layer_ids"],
            target_config=meta["target_config"],
            dtype=dtype,
            eagle_ids=meta.get("eagle_layer_ids"),
        )
    state = {
        k: (v.to(DTYPES[dtype]) if v.is_floating_point() else v).contiguous()
        for k, v in tensors.items()
    }
    _check_finite(checkpoint, tensors, state, dtype)
    out_dir = Path(out_dir)
    need = export_need(checkpoint=checkpoint, dtype=dtype)
    ensure_free_space(out_dir / "model.safetensors", need, "an exported drafter")
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_tensors(state, tmp, metadata={"format": "pt"})
    write_json(out_dir / "config.json", config)
    check_export(out_dir)
    served_ids = (
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        if "eagle_config" in config
        else config["dflash_config"]["target_layer_ids"]
    )
    log.info(
        "exported %s %s (step %s, accept_len %s): %d tensors, %s, aux layers %s (served as %s); "
        "check passed",
        config["architectures"][0],
        out_dir,
        meta.get("step"),
        (meta.get("metrics") or {}).get("acceptance_length"),
        len(state),
        dtype,
        meta["layer_ids"],
        served_ids,
    )


def _nonfinite(tensors: dict[str, Tensor]) -> dict[str, int]:
    counts = {
        k: int((~torch.isfinite(v)).sum()) for k, v in tensors.items() if v.is_floating_point()
    }
    return {k: n for k, n in sorted(counts.items()) if n}


def _check_finite(
    checkpoint: str | os.PathLike, tensors: dict[str, Tensor], state: dict[str, Tensor], dtype: str
) -> None:
    """Raise ExportError when the checkpoint, or its conversion to `dtype`, holds NaN/Inf."""
    bad, overflow = _nonfinite(tensors), _nonfinite(state)
    if bad:
        raise ExportError(
            f"{checkpoint}: {len(bad)} of {len(tensors)} tensors hold NaN/Inf values ("
            + ", ".join(f"{k}: {n}" for k, n in bad.items())
            + "); SGLang would serve garbage. Fix: retrain (snakemake --forcerun train); if "
            "training diverges, lower train.lr."
        )
    if overflow:
        raise ExportError(
            f"{checkpoint}: converting to {dtype} overflows to Inf in "
            + ", ".join(f"{k} ({n} value(s))" for k, n in overflow.items())
            + ". Fix: set export.dtype to bfloat16 or float32."
        )


def _tensor_faults(
    folder: Path, want: dict[str, tuple[list[int], str]], hf: dict | None = None
) -> list[str]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        have = {k: f.get_slice(k) for k in f.keys()}  # noqa: SIM118
        why = silent_losses(hf, have.keys()) if hf is not None else {}
        faults = [
            f"model.safetensors: missing tensor {k!r}" + (f" ({why[k]})" if k in why else "")
            for k in sorted(want.keys() - have)
        ]
        faults += [
            f"model.safetensors: unexpected tensor {k!r} (SGLang would skip it silently)"
            for k in sorted(have.keys() - want)
        ]
        for k in sorted(want.keys() & have.keys()):
            shape, st_dtype = list(have[k].get_shape()), have[k].get_dtype()
            if shape != want[k][0]:
                faults.append(f"model.safetensors: {k} has shape {shape}, expected {want[k][0]}")
            if st_dtype != want[k][1]:
                faults.append(f"model.safetensors: {k} has dtype {st_dtype}, expected {want[k][1]}")
        if not faults and "d2t" in want:
            faults += _vocab_faults(f.get_tensor("d2t"), f.get_tensor("t2d"))
        if not faults:
            bad = _nonfinite({k: f.get_tensor(k) for k in want})
            faults += [f"model.safetensors: {k} holds {n} NaN/Inf value(s)" for k, n in bad.items()]
    return faults


def _vocab_faults(d2t: Tensor, t2d: Tensor) -> list[str]:
    ids = torch.arange(d2t.shape[0]) + d2t
    if bool((ids < 0).any() | (ids >= t2d.shape[0]).any()):
        return ["d2t maps draft ids outside the target vocabulary"]
    if int(t2d.sum()) != d2t.shape[0] or not bool(t2d[ids].all()):
        return ["t2d does not mark exactly the target ids that d2t maps to"]
    return []


def export_faults(folder: str | os.PathLike) -> list[str]:
    """Every reason SGLang would load this folder wrongly (empty when it is sound)."""
    folder = Path(folder)
    files = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    faults = [f"missing file {n}" for n in DRAFTER_FILES if n not in files]
    faults += [
        f"unexpected file {n}"
        for n in sorted(files - {*DRAFTER_FILES, *ALLOWED_EXTRA_FILES})
        if not n.startswith(".")
    ]
    if "config.json" not in files:
        return faults
    hf = read_json(folder / "config.json")
    if family_of(hf):
        return _block_export_faults(folder, hf, files)
    expect = {
        "architectures": [MLA_ARCHITECTURE if is_mla(hf) else ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "tie_word_embeddings": False,
    }
    faults += [
        f"config.json: {k} is {hf.get(k)!r}, expected {v!r}"
        for k, v in expect.items()
        if hf.get(k) != v
    ]
    need = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        *(MLA_KEYS if is_mla(hf) else ("head_dim",)),
        "rms_norm_eps",
        "vocab_size",
        "draft_vocab_size",
        "target_hidden_size",
        "max_position_embeddings",
        "rope_theta",
        "torch_dtype",
    )
    faults += [f"config.json: missing key {k!r}" for k in need if k not in hf]
    ids = (hf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not (
        isinstance(ids, list) and len(ids) == AUX_LAYERS and all(isinstance(i, int) for i in ids)
    ):
        faults.append(
            f"config.json: eagle_config.eagle_aux_hidden_state_layer_ids is {ids!r}, expected "
            f"{AUX_LAYERS} layer ids (without them SGLang captures its default layers)"
        )
    if hf.get("torch_dtype") not in DTYPES:
        faults.append(f"config.json: torch_dtype {hf.get('torch_dtype')!r} not in {sorted(DTYPES)}")
    if faults or "model.safetensors" not in files:
        return faults
    return _tensor_faults(
        folder, expected_tensors(DrafterConfig.from_export(hf), hf["torch_dtype"]), hf
    )


def _block_export_faults(folder: Path, hf: dict, files: set[str]) -> list[str]:
    faults = block_faults(hf)
    if hf.get("torch_dtype") not in DTYPES:
        faults.append(f"config.json: torch_dtype {hf.get('torch_dtype')!r} not in {sorted(DTYPES)}")
    if faults or "model.safetensors" not in files:
        return faults
    try:
        cfg = config_from_export(hf)
    except (KeyError, TypeError, ValueError) as err:
        return [f"config.json: {err}"]
    return _tensor_faults(folder, block_tensors(cfg, hf["torch_dtype"]))


def check_export(folder: str | os.PathLike) -> None:
    """Raise ExportError listing every fault of an exported drafter folder."""
    faults = export_faults(folder)
    if faults:
        raise ExportError(
            f"{folder}: not a drafter folder SGLang loads correctly ({len(faults)} fault(s)):\n  - "
            + "\n  - ".join(faults)
            + "\nFix: rerun `snakemake --forcerun export` (or retrain if the checkpoint is wrong)."
        )
