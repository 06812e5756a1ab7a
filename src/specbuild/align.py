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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from specbuild.infra.io import write_json

__all__ = [
    "ALIGN_KEYS",
    "AlignSettings",
    "AlignmentError",
    "AlignmentPlan",
    "LayerAlignment",
    "pick_samples",
    "compare_layer",
    "alignment_faults",
    "plan_alignment",
    "compare_alignment",
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


@dataclass(frozen=True)
class AlignSettings:
    """The serving engine that recomputes the sample, the sample, and the thresholds its
    features must meet (the align rule's params)."""

    backend: str = "hf"  # the serving engine's feature backend (the hidden stage's registry)
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    samples: int = 8  # rows recomputed
    seed: int = 0  # picks the rows
    min_cosine: float = 0.99  # per layer, mean over the tokens
    max_abs_diff: float | None = None  # None: not checked
    norm_ratio_tolerance: float = 0.05  # |serving norm / training norm - 1|
    dtype: str = "float32"
    device: str = "auto"


@dataclass(frozen=True)
class AlignmentPlan:
    """The training side of the comparison, read from the shards before any engine loads:
    the rows picked (shard, row), their token ids, and their features as float32."""

    layer_ids: list[int]
    picks: list[tuple[int, int]]
    batch: list[list[int]]  # token ids of each picked row
    train_aux: Tensor  # shape: [T, 3H], T the picked rows' tokens
    train_last: Tensor  # shape: [T, H]
    shard_backends: list[str]  # the engines that made the shards

    @property
    def hidden(self) -> int:
        return int(self.train_last.shape[1])


def plan_alignment(
    shards: Sequence[tuple[Mapping[str, Tensor], Mapping[str, str]]], *, samples: int, seed: int
) -> AlignmentPlan:
    """The rows of `shards` (each read: tensors, metadata) to recompute, `samples` of them
    picked with `seed` (`pick_samples`), with their training features."""
    from specbuild.hidden.shards import dequantize_state

    layer_sets = {m["layer_ids"] for _, m in shards}
    if len(layer_sets) != 1:
        raise AlignmentError(f"align: shards disagree on layer_ids {sorted(layer_sets)}")
    layer_ids = [int(i) for i in json.loads(layer_sets.pop())]
    counts = [int(t["offsets"].numel()) - 1 for t, _ in shards]
    picks = pick_samples(counts, samples, seed)
    train_aux, train_last, batch = [], [], []
    for s, i in picks:
        t, _ = shards[s]
        a, b = int(t["offsets"][i]), int(t["offsets"][i + 1])
        batch.append(t["input_ids"][a:b].tolist())
        rows = {k: v[a:b] for k, v in t.items() if v.dim() == 2}  # aux, last and scales
        train_aux.append(dequantize_state(rows, "aux"))
        train_last.append(dequantize_state(rows, "last"))
    return AlignmentPlan(
        layer_ids=layer_ids,
        picks=picks,
        batch=batch,
        train_aux=torch.cat(train_aux),
        train_last=torch.cat(train_last),
        shard_backends=sorted({m.get("backend", "?") for _, m in shards}),
    )


def compare_alignment(
    plan: AlignmentPlan, serve_aux: Tensor, serve_last: Tensor
) -> list[LayerAlignment]:
    """Each layer of the plan's training features against the serving engine's (float32,
    `serve_aux` [T, 3H], `serve_last` [T, H]): low, mid, high, last."""
    hidden = plan.hidden

    def part(x: Tensor, k: int) -> Tensor:
        return x[:, k * hidden : (k + 1) * hidden]

    # the control for each layer: the serving engine's next captured layer (high's: mid, the
    # final state's: high), as a layer id off by that distance would have trained on
    layers = [
        compare_layer(
            name,
            lid,
            part(plan.train_aux, k),
            part(serve_aux, k),
            part(serve_aux, k + 1 if k + 1 < len(AUX_NAMES) else k - 1),
        )
        for k, (name, lid) in enumerate(zip(AUX_NAMES, plan.layer_ids, strict=True))
    ]
    layers.append(compare_layer("last", None, plan.train_last, serve_last, part(serve_aux, 2)))
    return layers


def _serve(
    plan: AlignmentPlan,
    target_dir: str | os.PathLike,
    settings: AlignSettings,
    share_idle_s: float,
) -> tuple[str, Tensor, Tensor]:
    """The serving engine's name and its features of the plan's rows (float32, on the CPU)."""
    from specbuild.eagle.target_info import read_target_info
    from specbuild.engines.model import ModelSpec
    from specbuild.engines.open import open_engine
    from specbuild.engines.runtime import Runtime

    # the hidden stage's own registry: align serves with exactly the classes that extract
    spec = ModelSpec(
        backend=settings.backend,
        folder=str(Path(target_dir).resolve()),
        layer_ids=plan.layer_ids,
        dtype=settings.dtype,
        device=settings.device,
        options=dict(settings.backend_options or {}),
        target_fingerprint=read_target_info(Path(target_dir) / "fingerprint.json").fingerprint,
    )
    with open_engine(spec, Runtime(idle_s=share_idle_s), name="align") as engine:
        served = engine.extract(plan.batch)
    return engine.name, served.aux.float().cpu(), served.last.float().cpu()


def check_alignment(
    *,
    shards: Sequence[str | os.PathLike],
    target_dir: str | os.PathLike,
    report: str | os.PathLike,
    settings: AlignSettings = AlignSettings(),
    share_idle_s: float = 0.0,
) -> list[LayerAlignment]:
    """Compare a fixed sample of shard rows with the serving backend; write the report (its
    table: specbuild.report.pipeline); raise AlignmentError naming every layer outside the
    thresholds. `share_idle_s` > 0: where the hidden jobs' shared engine is the serving one
    (same backend, options, dtype, device), it computes the sample: no second load."""
    from specbuild.hidden.shards import read_shard

    s = settings
    plan = plan_alignment([read_shard(p) for p in shards], samples=s.samples, seed=s.seed)
    log.info(
        "align: %d rows (%d tokens) from %d shard(s), layer ids %s; serving backend %s",
        len(plan.batch),
        sum(map(len, plan.batch)),
        len(shards),
        plan.layer_ids,
        s.backend,
    )
    serving, serve_aux, serve_last = _serve(plan, target_dir, s, share_idle_s)
    layers = compare_alignment(plan, serve_aux, serve_last)
    faults = alignment_faults(
        layers,
        min_cosine=s.min_cosine,
        max_abs_diff=s.max_abs_diff,
        norm_ratio_tolerance=s.norm_ratio_tolerance,
    )
    header = (
        f"Training features ({', '.join(plan.shard_backends)} shards) vs serving features "
        f"({serving}), {len(plan.batch)} rows, {int(plan.train_last.shape[0])} tokens"
    )
    md = _markdown(layers, header)
    log.info("align table:\n%s", md)
    write_json(
        report,
        {
            "ok": not faults,
            "faults": faults,
            "shard_backends": plan.shard_backends,
            "serving_backend": serving,
            "layer_ids": plan.layer_ids,
            "rows": [list(p) for p in plan.picks],
            "thresholds": {
                "min_cosine": s.min_cosine,
                "max_abs_diff": s.max_abs_diff,
                "norm_ratio_tolerance": s.norm_ratio_tolerance,
            },
            "layers": [asdict(la) for la in layers],
        },
    )
    if faults:
        raise AlignmentError(
            "align: the training features do not match what the serving engine computes:\n  "
            + "\n  ".join(faults)
            + "\nFix: extract hidden states with the serving engine (hidden.backend: "
            f"{s.backend}) and the same dtype, or serve with the engine that made the shards "
            f"({', '.join(plan.shard_backends)}); the table above is in this job's log."
        )
    return layers
