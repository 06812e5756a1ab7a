"""Stage `align`: do the training features match what the serving engine computes?

The failure this guards (docs/DESIGN.md's story): hidden states for training came from another
engine or precision than the one serving, and the drafter, trained on features it will never
see, accepts 25% of its drafts. Before training, a fixed, seeded sample of rows from the
hidden-state shards is recomputed by the serving engine's feature backend on the very same
token ids, and each layer (low, mid, high aux states and the final post-norm state) is
compared token by token:

  cosine_mean, cosine_min  cosine similarity of the two feature vectors per token
  cosine_p1                its 1st percentile: a low minimum from a handful of tokens (an
                           MoE router flipping on a near-tie, say) against a low tail
  other_layer_cosine       mean cosine of the training layer against the serving engine's
                           nearest *other* captured layer: what a layer-id mix-up scores, so
                           the margin between it and min_cosine shows the check can tell
  max_abs_diff             largest absolute difference over all tokens and dims
  norm_ratio               mean L2 norm (serving) / mean L2 norm (training shards)

The build stops when a layer falls outside the thresholds, naming the layer and the fix. The
table goes into the log first, so the numbers are there to read.
With the same backend on both sides the check is trivially green; with `hf` shards and an
SGLang-served target it measures exactly the mismatch above.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from specbuild.io import write_json

__all__ = [
    "ALIGN_KEYS",
    "AlignmentError",
    "LayerAlignment",
    "pick_samples",
    "compare_layer",
    "alignment_faults",
    "check_alignment",
]

log = logging.getLogger("specbuild")

ALIGN_KEYS = (
    "layer",
    "layer_id",
    "tokens",
    "cosine_mean",
    "cosine_min",
    "cosine_p1",
    "other_layer_cosine",
    "max_abs_diff",
    "norm_ratio",
    "status",
)
AUX_NAMES = ("low", "mid", "high")


class AlignmentError(RuntimeError):
    """Training features and serving features disagree beyond the configured thresholds."""


@dataclass
class LayerAlignment:
    layer: str  # low | mid | high | last
    layer_id: int | None  # layer-output id (None for the final post-norm state)
    tokens: int
    cosine_mean: float
    cosine_min: float
    cosine_p1: float
    other_layer_cosine: float | None
    max_abs_diff: float
    norm_ratio: float
    status: str = "ok"


def pick_samples(counts: Sequence[int], n: int, seed: int) -> list[tuple[int, int]]:
    """A fixed sample of (shard index, row index): `n` rows drawn without replacement with a
    seeded RNG, so the same shards always give the same rows."""
    pool = [(s, i) for s, c in enumerate(counts) for i in range(c)]
    if not pool:
        raise ValueError("align: the hidden-state shards hold no rows")
    rng = random.Random(seed)
    return sorted(rng.sample(pool, min(n, len(pool))))


def _cosine(a: Tensor, b: Tensor) -> Tensor:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-12)  # shape: [T]


def compare_layer(
    name: str, layer_id: int | None, train: Tensor, serve: Tensor, other: Tensor | None = None
) -> LayerAlignment:
    """Metrics of one layer over all sampled tokens; tensors [T, H] float32, `other` the
    serving engine's state of another layer (the mix-up control)."""
    if train.shape != serve.shape:
        raise AlignmentError(
            f"align: layer {name}: training features {tuple(train.shape)} vs serving "
            f"{tuple(serve.shape)}; the engines disagree on the token rows or the hidden size"
        )
    cos = _cosine(train, serve)
    norms_t = train.norm(dim=-1)  # shape: [T]
    norms_s = serve.norm(dim=-1)
    return LayerAlignment(
        layer=name,
        layer_id=layer_id,
        tokens=int(train.shape[0]),
        cosine_mean=float(cos.mean()),
        cosine_min=float(cos.min()),
        cosine_p1=float(torch.quantile(cos, 0.01)),
        other_layer_cosine=None if other is None else float(_cosine(train, other).mean()),
        max_abs_diff=float((train - serve).abs().max()),
        norm_ratio=float(norms_s.mean() / norms_t.mean().clamp_min(1e-12)),
    )


def alignment_faults(
    layers: Sequence[LayerAlignment],
    *,
    min_cosine: float,
    max_abs_diff: float | None,
    norm_ratio_tolerance: float,
) -> list[str]:
    """Every layer outside a threshold, one message each; marks their status."""
    faults = []
    for la in layers:
        bad = []
        if la.cosine_mean < min_cosine:
            bad.append(f"mean cosine {la.cosine_mean:.5f} < align.min_cosine {min_cosine}")
        if max_abs_diff is not None and la.max_abs_diff > max_abs_diff:
            bad.append(f"max |diff| {la.max_abs_diff:.4g} > align.max_abs_diff {max_abs_diff}")
        if abs(la.norm_ratio - 1.0) > norm_ratio_tolerance:
            bad.append(
                f"norm ratio {la.norm_ratio:.4f} outside 1 ± align.norm_ratio_tolerance "
                f"{norm_ratio_tolerance}"
            )
        if bad:
            la.status = "FAIL"
            where = f"layer {la.layer}" + (
                f" (layer-output id {la.layer_id})"
                if la.layer_id is not None
                else " (final post-norm state)"
            )
            faults.append(f"{where}: " + "; ".join(bad))
    return faults


def _markdown(layers: Sequence[LayerAlignment], header: str) -> str:
    lines = [header, "", "| " + " | ".join(ALIGN_KEYS) + " |", "|" + "---|" * len(ALIGN_KEYS)]
    for la in layers:
        d = asdict(la)
        cells = [f"{d[k]:.6g}" if isinstance(d[k], float) else str(d[k]) for k in ALIGN_KEYS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def check_alignment(
    *,
    shards: Sequence[str | os.PathLike],
    target_dir: str | os.PathLike,
    report: str | os.PathLike,
    backend: str = "hf",
    backend_options: Mapping[str, Any] | None = None,
    samples: int = 8,
    seed: int = 0,
    min_cosine: float = 0.99,
    max_abs_diff: float | None = None,
    norm_ratio_tolerance: float = 0.05,
    dtype: str = "float32",
    device: str = "auto",
    share_idle_s: float = 0.0,
) -> list[LayerAlignment]:
    """Compare a fixed sample of shard rows with the serving backend; write the report (its
    table: specbuild.report.pipeline); raise AlignmentError naming every layer outside the
    thresholds. `share_idle_s` > 0: where the hidden jobs' shared engine is the serving one
    (same backend, options, dtype, device), it computes the sample: no second load."""
    from specbuild.engines.model import ModelSpec
    from specbuild.engines.open import open_engine
    from specbuild.engines.runtime import Runtime
    from specbuild.hidden.shards import dequantize_state, read_shard
    from specbuild.target import read_target_info

    loaded = [read_shard(p) for p in shards]
    layer_sets = {m["layer_ids"] for _, m in loaded}
    if len(layer_sets) != 1:
        raise AlignmentError(f"align: shards disagree on layer_ids {sorted(layer_sets)}")
    layer_ids = [int(i) for i in json.loads(layer_sets.pop())]
    counts = [int(t["offsets"].numel()) - 1 for t, _ in loaded]
    picks = pick_samples(counts, samples, seed)
    train_aux, train_last, batch = [], [], []
    for s, i in picks:
        t, _ = loaded[s]
        a, b = int(t["offsets"][i]), int(t["offsets"][i + 1])
        batch.append(t["input_ids"][a:b].tolist())
        rows = {k: v[a:b] for k, v in t.items() if v.dim() == 2}  # aux, last and scales
        train_aux.append(dequantize_state(rows, "aux"))
        train_last.append(dequantize_state(rows, "last"))
    log.info(
        "align: %d rows (%d tokens) from %d shard(s), layer ids %s; serving backend %s",
        len(batch),
        sum(map(len, batch)),
        len(shards),
        layer_ids,
        backend,
    )
    # the hidden stage's own registry: align serves with exactly the classes that extract
    fingerprint = read_target_info(Path(target_dir) / "fingerprint.json").fingerprint
    spec = ModelSpec(
        backend=backend,
        folder=str(Path(target_dir).resolve()),
        layer_ids=layer_ids,
        dtype=dtype,
        device=device,
        options=dict(backend_options or {}),
        target_fingerprint=fingerprint,
    )
    with open_engine(spec, Runtime(idle_s=share_idle_s), name="align") as engine:
        served = engine.extract(batch)
    serve_aux = served.aux.float().cpu()  # shape: [T, 3H]
    serve_last = served.last.float().cpu()  # shape: [T, H]
    t_aux, t_last = torch.cat(train_aux), torch.cat(train_last)
    hidden = t_last.shape[1]

    def part(x: Tensor, k: int) -> Tensor:
        return x[:, k * hidden : (k + 1) * hidden]

    # the control for each layer: the serving engine's next captured layer (high's: mid, the
    # final state's: high), as a layer id off by that distance would have trained on
    layers = [
        compare_layer(
            name,
            lid,
            part(t_aux, k),
            part(serve_aux, k),
            part(serve_aux, k + 1 if k + 1 < len(AUX_NAMES) else k - 1),
        )
        for k, (name, lid) in enumerate(zip(AUX_NAMES, layer_ids, strict=True))
    ]
    layers.append(compare_layer("last", None, t_last, serve_last, part(serve_aux, 2)))
    faults = alignment_faults(
        layers,
        min_cosine=min_cosine,
        max_abs_diff=max_abs_diff,
        norm_ratio_tolerance=norm_ratio_tolerance,
    )
    shard_backends = sorted({m.get("backend", "?") for _, m in loaded})
    header = (
        f"Training features ({', '.join(shard_backends)} shards) vs serving features "
        f"({engine.name}), {len(batch)} rows, {int(t_last.shape[0])} tokens"
    )
    md = _markdown(layers, header)
    log.info("align table:\n%s", md)
    write_json(
        report,
        {
            "ok": not faults,
            "faults": faults,
            "shard_backends": shard_backends,
            "serving_backend": engine.name,
            "layer_ids": layer_ids,
            "rows": [list(p) for p in picks],
            "thresholds": {
                "min_cosine": min_cosine,
                "max_abs_diff": max_abs_diff,
                "norm_ratio_tolerance": norm_ratio_tolerance,
            },
            "layers": [asdict(la) for la in layers],
        },
    )
    if faults:
        raise AlignmentError(
            "align: the training features do not match what the serving engine computes:\n  "
            + "\n  ".join(faults)
            + "\nFix: extract hidden states with the serving engine (hidden.backend: "
            f"{backend}) and the same dtype, or serve with the engine that made the shards "
            f"({', '.join(shard_backends)}); the table above is in this job's log."
        )
    return layers
