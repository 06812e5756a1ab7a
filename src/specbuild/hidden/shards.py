"""Hidden-state shards: the file layout in docs/DESIGN.md, written, read and checked here.

One safetensors file per tokenized shard:

    input_ids  int32 [T]          token ids, samples concatenated in tokenized-shard order
    loss_mask  uint8 [T]          1 on assistant tokens
    offsets    int64 [N+1]        sample i spans offsets[i]:offsets[i+1]
    aux        bf16 [T, 3H]       low | mid | high layer outputs, concatenated in that order
    last       bf16 [T, H]        final post-norm hidden state (HF hidden_states[-1])

or, with dtype "fp8" (fp8.py), aux and last as float8_e4m3fn, each with its float32 scales:

    aux_scale  float32 [T, 3G]    G scales per token and layer, layer by layer (hidden.storage
    last_scale float32 [T, G]     fp8: G = 1, the whole layer; fp8-g<N>: one per N channels)

An fp8 shard written before `last` was stored in fp8 too (last bf16, no last_scale, aux_scale
[T, 3]) still reads and verifies: its data is sound, only larger.

metadata (str -> str): layer_ids (JSON list), backend, target_fingerprint,
tokenizer_fingerprint, dtype ("bf16" | "fp8"), specbuild_version, and checksums (JSON, added by
`write_shard`: see integrity.py).

The failure guarded: a shard that is truncated, holds NaN/Inf, changed on disk after it was
written, or does not line up token for token with the tokenized rows trains a drafter on garbage
without any error. `check_shard` (tensors in memory) and `verify_shard_file` (a file, mapped,
checksums included) list every fault at once; nothing downstream should read a shard it has not
passed.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from specbuild.eagle.layers import AUX_LAYERS
from specbuild.hidden.fp8 import FP8_DTYPE, dequantize_fp8, scale_groups
from specbuild.hidden.integrity import (
    CHECKSUM_KEY,
    TORCH_DTYPES,
    checksum_faults,
    count_nonfinite,
    recorded_algorithm,
    scan_file,
    tensor_digests,
    tensor_layout,
)
from specbuild.hidden.tokens import TokenShard
from specbuild.hidden.writer import Layout, shard_writer
from specbuild.infra.faults import JobFault

__all__ = [
    "META_KEYS",
    "SHARD_KEYS",
    "STORAGE_DTYPES",
    "ShardError",
    "FP8_SCALES",
    "LAYERS",
    "state_nbytes_per_token",
    "layout_nbytes",
    "shard_layout",
    "shard_nbytes",
    "write_shard",
    "read_shard",
    "read_header",
    "dequantize_state",
    "shard_faults",
    "check_shard",
    "shard_file_faults",
    "verify_shard_file",
]

SHARD_KEYS = ("input_ids", "loss_mask", "offsets", "aux", "last")
META_KEYS = (
    "layer_ids",
    "backend",
    "target_fingerprint",
    "tokenizer_fingerprint",
    "dtype",
    "specbuild_version",
)
STORAGE_DTYPES = {"bf16": torch.bfloat16, "fp8": FP8_DTYPE}
FP8_SCALES = {"aux": "aux_scale", "last": "last_scale"}  # an fp8 state -> its scales
LAYERS = {"aux": AUX_LAYERS, "last": 1}  # layers side by side in each state
FIXED_DTYPES = {
    "input_ids": torch.int32,
    "loss_mask": torch.uint8,
    "offsets": torch.int64,
    "aux_scale": torch.float32,
    "last_scale": torch.float32,
}
# Tensors verify_shard_file loads whole (a few bytes per token); aux and last are only scanned.
_SMALL_KEYS = ("input_ids", "loss_mask", "offsets", "aux_scale", "last_scale")
_VALUE_KEYS = ("aux", "last", "aux_scale", "last_scale")  # float tensors counted for NaN/Inf


def state_nbytes_per_token(hidden_size: int, storage: str, fp8_group_size: int = 0) -> int:
    """Bytes of `aux` and `last` per token: four layers at the storage dtype (+ fp8's float32
    scales)."""
    layers = AUX_LAYERS + 1
    scales = layers * 4 * scale_groups(hidden_size, fp8_group_size) if storage == "fp8" else 0
    return layers * hidden_size * STORAGE_DTYPES[storage].itemsize + scales


def shard_layout(
    *, tokens: int, samples: int, hidden_size: int, storage: str, fp8_group_size: int = 0
) -> Layout:
    """{name: (dtype, shape)} of every tensor of a shard of `tokens` tokens in `samples`."""
    layout = {
        "input_ids": (FIXED_DTYPES["input_ids"], (tokens,)),
        "loss_mask": (FIXED_DTYPES["loss_mask"], (tokens,)),
        "offsets": (FIXED_DTYPES["offsets"], (samples + 1,)),
    }
    groups = scale_groups(hidden_size, fp8_group_size) if storage == "fp8" else 0
    for key, layers in LAYERS.items():
        layout[key] = (STORAGE_DTYPES[storage], (tokens, layers * hidden_size))
        if groups:
            layout[FP8_SCALES[key]] = (torch.float32, (tokens, layers * groups))
    return layout


def shard_nbytes(
    *, tokens: int, samples: int, hidden_size: int, storage: str, fp8_group_size: int = 0
) -> int:
    """Bytes a shard of `tokens` tokens in `samples` samples takes on disk (header excluded)."""
    layout = shard_layout(
        tokens=tokens,
        samples=samples,
        hidden_size=hidden_size,
        storage=storage,
        fp8_group_size=fp8_group_size,
    )
    return layout_nbytes(layout)


def layout_nbytes(layout: Layout) -> int:
    """Bytes the tensors of `layout` take on disk (header excluded)."""
    return sum(dtype.itemsize * math.prod(shape) for dtype, shape in layout.values())


class ShardError(JobFault, ValueError):
    """A hidden-state shard that must not be used; the message names the file and every fault,
    and the fix: a job's log shows it alone (infra.joblog)."""


def write_shard(
    path: str | os.PathLike, tensors: Mapping[str, Tensor], meta: Mapping[str, str]
) -> None:
    """Write a shard atomically (temp + rename) with its `checksums` metadata (a digest of
    every tensor's bytes and of the header, checked by `verify_shard_file` before training).

    Writes what it is given, sound or not (tests write faulty shards on purpose); the stage
    `hidden` fills a `shard_writer` directly and checks before it publishes.
    """
    layout = {k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()}
    with shard_writer(path, layout, meta) as writer:
        for key, value in tensors.items():
            writer.tensors[key].copy_(value)
        writer.seal()  # scans every piece: none was marked landed


def _fix(path: str | os.PathLike) -> str:
    return (
        f"Fix: delete it and rerun snakemake (its `hidden` job rebuilds it), or force that job: "
        f"snakemake --forcerun {path}"
    )


class _HeaderFault(Exception):
    """A header fault without the file name (parse_header's callers add it)."""


def _parse_header(path: str | os.PathLike) -> tuple[dict[str, dict], dict[str, str], int]:
    """(tensor entries as in the header, metadata, byte where the data section starts)."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        raw = fh.read(n) if 0 < n <= size - 8 else b""
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict):
        raise _HeaderFault("no valid safetensors header; the file is truncated or corrupt")
    meta = header.pop("__metadata__", None) or {}
    try:
        end = max((int(v["data_offsets"][1]) for v in header.values()), default=0)
        entries = {
            k: {
                "dtype": str(v["dtype"]),
                "shape": list(v["shape"]),
                "data_offsets": [int(x) for x in v["data_offsets"]],
            }
            for k, v in header.items()
        }
        ok = all(
            all(isinstance(d, int) and d >= 0 for d in e["shape"])
            and 0 <= e["data_offsets"][0] <= e["data_offsets"][1]
            for e in entries.values()
        )
    except (TypeError, KeyError, ValueError, IndexError):
        ok = False
    if not ok:
        raise _HeaderFault("a tensor entry of the header is malformed; the file is corrupt")
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _HeaderFault("header metadata is not a string map; the file is corrupt")
    if size != 8 + n + end:
        raise _HeaderFault(
            f"{size} bytes on disk, the header declares {8 + n + end}; the file is truncated "
            "or padded"
        )
    return entries, meta, 8 + n


def read_header(path: str | os.PathLike) -> tuple[dict[str, tuple[str, list[int]]], dict[str, str]]:
    """({name: (safetensors dtype, shape)}, metadata) from the header alone, checking the length.

    A file shorter than its header declares (truncated copy) raises ShardError naming it.
    """
    try:
        entries, meta, _ = _parse_header(path)
    except _HeaderFault as err:
        raise ShardError(f"{path}: {err}. {_fix(path)}") from None
    return {k: (v["dtype"], v["shape"]) for k, v in entries.items()}, meta


def read_shard(path: str | os.PathLike) -> tuple[dict[str, Tensor], dict[str, str]]:
    """All tensors and the metadata of a shard, checked against its checksums when it has them;
    an unreadable or changed file raises ShardError naming it."""
    read_header(path)  # a truncated file fails here with its byte counts
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = dict(fh.metadata() or {})
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError, RuntimeError) as err:
        raise ShardError(
            f"{path}: not a readable safetensors file ({err}); it is truncated or corrupt. "
            f"{_fix(path)}"
        ) from err
    if CHECKSUM_KEY in meta:  # hashing what is already in memory, on every core
        digests = tensor_digests(tensors, recorded_algorithm(meta))
        faults = checksum_faults(meta, tensor_layout(tensors), digests)
        if faults:
            raise ShardError(
                f"{path}: hidden-state shard changed since it was written:\n  - "
                + "\n  - ".join(faults)
                + f"\n{_fix(path)}"
            )
    return tensors, meta


def dequantize_state(tensors: Mapping[str, Tensor], key: str) -> Tensor:
    """`aux` [T, 3H] or `last` [T, H] as float32, whether stored as bf16 or as fp8 with its
    scales (`aux_scale`, `last_scale`)."""
    x = tensors[key]
    if x.dtype == FP8_DTYPE:
        return dequantize_fp8(x, tensors[FP8_SCALES[key]])
    return x.float()


def _meta_faults(meta: Mapping[str, str], expected: Mapping[str, str]) -> list[str]:
    faults = [f"metadata: missing key {k!r}" for k in META_KEYS if k not in meta]
    if "dtype" in meta and meta["dtype"] not in STORAGE_DTYPES:
        faults.append(f"metadata dtype {meta['dtype']!r} is not one of {sorted(STORAGE_DTYPES)}")
    if "layer_ids" in meta:
        try:
            ids = json.loads(meta["layer_ids"])
            ok = (
                isinstance(ids, list)
                and len(ids) == AUX_LAYERS
                and all(isinstance(i, int) and i >= 0 for i in ids)
            )
        except json.JSONDecodeError:
            ok = False
        if not ok:
            faults.append(
                f"metadata layer_ids {meta['layer_ids']!r}: want a JSON list of "
                f"{AUX_LAYERS} layer-output ids"
            )
    for key, want in expected.items():
        if key in meta and meta[key] != want:
            faults.append(f"metadata {key}: shard has {meta[key]!r}, expected {want!r}")
    return faults


def _structure_faults(
    tensors: Mapping[str, Tensor], meta: Mapping[str, str], hidden_size: int | None
) -> list[str]:
    fp8 = meta.get("dtype") == "fp8"
    # an fp8 shard from before `last` went fp8 too has a bf16 last and no last_scale
    last = tensors.get("last")
    last_fp8 = fp8 and (last is None or last.dtype == FP8_DTYPE or "last_scale" in tensors)
    want_keys = set(SHARD_KEYS) | {
        FP8_SCALES[k] for k, on in (("aux", fp8), ("last", last_fp8)) if on
    }
    faults = [f"missing tensor {k!r}" for k in sorted(want_keys - tensors.keys())]
    faults += [f"unexpected tensor {k!r}" for k in sorted(tensors.keys() - want_keys)]
    if faults:
        return faults
    storage = STORAGE_DTYPES.get(meta.get("dtype", ""), torch.bfloat16)
    want_dtypes = dict(FIXED_DTYPES, aux=storage, last=storage if last_fp8 else torch.bfloat16)
    for key, t in tensors.items():
        if t.dtype != want_dtypes[key]:
            faults.append(f"{key}: dtype {t.dtype}, expected {want_dtypes[key]}")
    ids, aux, last, offsets = (tensors[k] for k in ("input_ids", "aux", "last", "offsets"))
    if ids.dim() != 1:
        return faults + [f"input_ids: shape {tuple(ids.shape)}, expected [T]"]
    n_tok = ids.shape[0]
    if tuple(tensors["loss_mask"].shape) != (n_tok,):
        faults.append(f"loss_mask: shape {tuple(tensors['loss_mask'].shape)}, expected [{n_tok}]")
    if last.dim() != 2 or last.shape[0] != n_tok:
        faults.append(f"last: shape {tuple(last.shape)}, expected [{n_tok}, H]")
    elif hidden_size is not None and last.shape[1] != hidden_size:
        faults.append(f"last: hidden size {last.shape[1]}, the target's is {hidden_size}")
    elif tuple(aux.shape) != (n_tok, AUX_LAYERS * last.shape[1]):
        faults.append(
            f"aux: shape {tuple(aux.shape)}, expected [{n_tok}, {AUX_LAYERS * last.shape[1]}]"
        )
    if fp8 and last.dim() == 2:
        faults += _scale_faults(tensors, n_tok, last.shape[1], last_fp8)
    if offsets.dim() != 1 or offsets.shape[0] < 2:
        faults.append(f"offsets: shape {tuple(offsets.shape)}, expected [N+1] with N >= 1")
    elif offsets.dtype == torch.int64:
        if int(offsets[0]) != 0 or int(offsets[-1]) != n_tok:
            faults.append(
                f"offsets: must run from 0 to T={n_tok}, got {int(offsets[0])}..{int(offsets[-1])}"
            )
        if bool((offsets[1:] <= offsets[:-1]).any()):
            faults.append("offsets: not strictly increasing (an empty or reordered sample)")
    return faults


def _scale_faults(
    tensors: Mapping[str, Tensor], n_tok: int, hidden: int, last_fp8: bool
) -> list[str]:
    """Shapes of an fp8 shard's scales: aux_scale [T, 3G] and last_scale [T, G] (when last is
    fp8), G dividing H."""
    aux_scale = tuple(tensors["aux_scale"].shape)
    g = aux_scale[1] // AUX_LAYERS if len(aux_scale) == 2 else 0
    if aux_scale != (n_tok, AUX_LAYERS * g) or not g or hidden % g:
        return [f"aux_scale: shape {aux_scale}, expected [{n_tok}, 3G] with G dividing H={hidden}"]
    if last_fp8 and tuple(tensors["last_scale"].shape) != (n_tok, g):
        return [
            f"last_scale: shape {tuple(tensors['last_scale'].shape)}, expected [{n_tok}, {g}] "
            f"(aux_scale holds {g} per layer)"
        ]
    return []


def _value_faults(tensors: Mapping[str, Tensor], nonfinite: Mapping[str, int]) -> list[str]:
    """`nonfinite`: NaN/Inf counts of aux, last and their scales (an fp8 state counts its NaN
    codes; a bad scale is reported under its own name)."""
    faults = []
    if bool((tensors["loss_mask"] > 1).any()):
        faults.append("loss_mask: values other than 0 and 1")
    for key in _VALUE_KEYS:
        if nonfinite.get(key):
            faults.append(f"{key}: {nonfinite[key]} NaN/Inf value(s)")
    for key in FP8_SCALES.values():
        if key in tensors and bool((tensors[key] <= 0).any()):
            faults.append(f"{key}: non-positive scale(s)")
    return faults


def _token_faults(tensors: Mapping[str, Tensor], tokens: TokenShard) -> list[str]:
    faults = []
    if not torch.equal(tensors["offsets"], tokens.offsets):
        n_have, n_want = tensors["offsets"].shape[0] - 1, len(tokens)
        faults.append(
            f"offsets: differ from the tokenized shard {tokens.path} "
            f"({n_have} samples / {int(tensors['offsets'][-1])} tokens here, "
            f"{n_want} / {tokens.num_tokens} there)"
        )
        return faults  # token comparisons below would only repeat this
    for key in ("input_ids", "loss_mask"):
        diff = (tensors[key] != getattr(tokens, key)).nonzero()
        if diff.numel():
            pos = int(diff[0, 0])
            sample = int(torch.searchsorted(tokens.offsets, pos, right=True)) - 1
            faults.append(
                f"{key}: {diff.shape[0]} position(s) differ from {tokens.path}; first at token "
                f"{pos} (sample {sample}, id {tokens.ids[sample]!r})"
            )
    return faults


def shard_faults(
    tensors: Mapping[str, Tensor],
    meta: Mapping[str, str],
    *,
    hidden_size: int | None = None,
    tokens: TokenShard | None = None,
    expected_meta: Mapping[str, str] | None = None,
    nonfinite: Mapping[str, int] | None = None,
) -> list[str]:
    """Every reason this shard must not be used (empty when it is sound). `nonfinite`: NaN/Inf
    counts per tensor already taken (a writer's scan); counted here when not given."""
    faults = _meta_faults(meta, expected_meta or {})
    structure = _structure_faults(tensors, meta, hidden_size)
    if structure:
        return faults + structure  # value checks on a malformed shard would only add noise
    if nonfinite is None:
        nonfinite = {k: count_nonfinite(tensors[k]) for k in _VALUE_KEYS if k in tensors}
    faults += _value_faults(tensors, nonfinite)
    if tokens is not None:
        faults += _token_faults(tensors, tokens)
    return faults


def check_shard(
    tensors: Mapping[str, Tensor],
    meta: Mapping[str, str],
    *,
    name: str | os.PathLike,
    hidden_size: int | None = None,
    tokens: TokenShard | None = None,
    expected_meta: Mapping[str, str] | None = None,
    nonfinite: Mapping[str, int] | None = None,
) -> None:
    """Raise ShardError naming `name` and listing every fault; return quietly when sound."""
    faults = shard_faults(
        tensors,
        meta,
        hidden_size=hidden_size,
        tokens=tokens,
        expected_meta=expected_meta,
        nonfinite=nonfinite,
    )
    if faults:
        raise ShardError(
            f"{name}: hidden-state shard failed verification ({len(faults)} fault(s)):\n  - "
            + "\n  - ".join(faults)
            + f"\nFix: rerun its `hidden` job (snakemake --forcerun {name}); if the tokenized "
            "shard changed, its hidden shard must be rebuilt from it."
        )


def shard_file_faults(
    path: str | os.PathLike,
    *,
    hidden_size: int | None = None,
    tokens: TokenShard | None = None,
    expected_meta: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(every reason this shard file must not be used, its metadata), reading it once.

    The checks of `check_shard` plus, when the shard records them, its checksums. aux and last
    are scanned from the mapped file in 16 MiB pieces on every core, never copied whole. A
    shard without `checksums` (written before they existed) gets every check but that one; the
    caller sees it in the metadata.
    """
    try:
        entries, meta, data_start = _parse_header(path)
    except _HeaderFault as err:
        return [str(err)], {}
    scan = scan_file(
        path, entries, data_start, keep=_SMALL_KEYS, algorithm=recorded_algorithm(meta)
    )
    faults = list(scan.faults)
    if CHECKSUM_KEY in meta:
        layout = {k: (e["dtype"], e["shape"]) for k, e in entries.items()}
        faults += checksum_faults(meta, layout, scan.digests)
    faults += _meta_faults(meta, expected_meta or {})
    # aux and last enter the shape checks as shape-only stand-ins: their values were counted
    tensors = dict(scan.tensors)
    for key in ("aux", "last"):
        entry = entries.get(key)
        dtype = TORCH_DTYPES.get(entry["dtype"]) if entry else None
        if dtype is not None:
            tensors[key] = torch.empty(entry["shape"], dtype=dtype, device="meta")
    structure = _structure_faults(tensors, meta, hidden_size)
    if structure:
        return faults + structure, meta
    faults += _value_faults(tensors, scan.nonfinite)
    if tokens is not None:
        faults += _token_faults(tensors, tokens)
    return faults, meta


def verify_shard_file(
    path: str | os.PathLike,
    *,
    hidden_size: int | None = None,
    tokens: TokenShard | None = None,
    expected_meta: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Raise ShardError naming the file and every fault `shard_file_faults` finds; return its
    metadata when it is sound."""
    faults, meta = shard_file_faults(
        path, hidden_size=hidden_size, tokens=tokens, expected_meta=expected_meta
    )
    if faults:
        raise ShardError(
            f"{path}: hidden-state shard failed verification ({len(faults)} fault(s)):\n  - "
            + "\n  - ".join(faults)
            + f"\n{_fix(path)}"
        )
    return meta
