"""Transformers model loads: a target's text model as a causal LM, however its folder wraps it.

Every stage that runs the target with transformers (generate's and the bench's hf engines, the
hidden stage's hf feature backend) loads it here: from safetensors only, in eval mode, after
releasing the idle kept engines on the GPUs it is about to use, with one log line a load
(benchmarks/engine_loads.py counts them).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from specbuild.eagle.text_model import TextModel, find_text_model, weight_map
from specbuild.engines.keepers import release_idle
from specbuild.infra.dtypes import torch_dtype
from specbuild.infra.onednn_linear import use_onednn_linears

__all__ = ["load_causal_lm"]

log = logging.getLogger("specbuild")


def load_causal_lm(
    folder: str | os.PathLike,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    trust_remote_code: bool = False,
) -> torch.nn.Module:
    """The text model of the HF folder `folder` as a transformers causal LM, eval mode, from
    safetensors only; for inference: on CPU in float32 its linear layers run through oneDNN
    (`specbuild.infra.onednn_linear`). A multimodal wrapper (`text_config`) gives its text model."""
    from transformers import AutoModelForCausalLM

    if str(device).startswith("cuda"):
        # an idle kept engine (a generation server, a hidden keeper) on these GPUs: its
        # memory is this model's now, as for an SGLang start or a training
        release_idle()
    start = time.perf_counter()
    text = find_text_model(folder)
    if text.wrapped:
        model = _load_wrapped_text_model(folder, text, torch_dtype(dtype))
    else:
        model = AutoModelForCausalLM.from_pretrained(
            str(folder),
            dtype=torch_dtype(dtype),
            use_safetensors=True,
            trust_remote_code=trust_remote_code,
        )
    model = model.to(device).eval()
    use_onednn_linears(model)
    # one line a load, whichever stage: benchmarks/engine_loads.py counts them
    log.info(
        "loaded the target's text model with transformers on %s (%s) in %.1f s",
        device,
        dtype,
        time.perf_counter() - start,
    )
    return model


def _load_wrapped_text_model(folder: str | os.PathLike, text: TextModel, dtype: torch.dtype):
    """A wrapper's text model built from its `text_config` (a model type transformers knows)
    and its tensors read under the wrapper's names with safetensors; vision tensors are left.
    The tensors go through `from_pretrained(state_dict=...)`, not `load_state_dict`, so
    transformers' own checkpoint conversions apply (DeepSeek-V3's per-expert tensors into its
    fused expert weights)."""
    from safetensors import safe_open
    from transformers import AutoConfig, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    fields = dict(text.config)
    model_type = fields.pop("model_type", None)
    try:
        cfg = AutoConfig.for_model(model_type, **fields)
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]
    except (KeyError, ValueError):
        raise ValueError(
            f"{folder}/config.json: text_config.model_type {model_type!r} is not a causal LM "
            "transformers knows; the hf backend cannot build this text model"
        ) from None
    by_file: dict[str, list[str]] = {}
    for name, file in weight_map(folder).items():
        if text.plain_name(name) is not None:
            by_file.setdefault(file, []).append(name)
    state = {}
    for file, names in sorted(by_file.items()):
        with safe_open(str(Path(folder) / file), framework="pt") as f:
            state |= {text.plain_name(n): f.get_tensor(n) for n in names}
    model, info = model_class.from_pretrained(
        None, config=cfg, state_dict=state, dtype=dtype, output_loading_info=True
    )
    tied = getattr(cfg, "tie_word_embeddings", False)
    missing = [k for k in info["missing_keys"] if not (k == "lm_head.weight" and tied)]
    unexpected, mismatched = info["unexpected_keys"], info.get("mismatched_keys") or []
    if missing or unexpected or mismatched:
        raise ValueError(
            f"{folder}: the text model's tensors (under {text.decoder_prefix!r}) do not fit its "
            f"text_config: {missing=} {unexpected=} {mismatched=}"
        )
    if (Path(folder) / "generation_config.json").is_file():  # the folder's stop ids, as served
        model.generation_config = GenerationConfig.from_pretrained(str(folder))
    return model
