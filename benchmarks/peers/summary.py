"""The peers run's configs and its table (benchmarks/peers/specforge.sh).

    python3 -m benchmarks.peers.summary config EXAMPLE OVERLAY OUT      the merged config
    python3 -m benchmarks.peers.summary settings CONFIG                 "EPOCHS LR VARIANTS"
    python3 -m benchmarks.peers.summary with-drafter CONFIG NAME FOLDER OUT
    python3 -m benchmarks.peers.summary table --results results --logs logs --specforge DIR ...

The table (markdown, for BENCHMARKS.md): per drafter, the trainer, its epochs and optimizer
steps, training wall time, tokens/s and GPU-minutes, the simulated acceptance on the held-out
rows (ours: the exported checkpoint's eval row; the peer's: the same rows through
`evaluate_drafter`), served acceptance per set, and ours over the peer's with a paired 95%
interval (results/tables/peers.csv, the report's own table).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import re
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import pandas as pd
import yaml

from specbuild.report.tables import best_train_row, simulated_accept_length, to_markdown

__all__ = ["merge", "train_figures", "peer_figures", "main"]

COMPARED = "epochs_4"  # the variant whose epochs and lr SpecForge trains with
CHAIN_STEPS = 3  # the bench's 3-1-4
TRAINED = re.compile(r"trained (\d+) tokens in ([\d.]+) s of steps: (\d+) tokens/s")
STEPS = re.compile(r"step (\d+)/(\d+) epoch")


def merge(base: Mapping, over: Mapping) -> dict:
    """`over` laid on `base`, mapping by mapping; train.variants replaced whole."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    if "variants" in over.get("train", {}):
        out["train"]["variants"] = copy.deepcopy(dict(over["train"]["variants"]))
    return out


def _clock_s(line: str) -> int | None:
    m = re.match(r"(\d\d):(\d\d):(\d\d) ", line)
    return int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) if m else None


def train_figures(log: Path) -> dict:
    """From a train job's log: tokens, seconds of steps, tokens/s, optimizer steps, and the
    job's wall time (first to last log line)."""
    lines = log.read_text(errors="replace").splitlines()
    out: dict = {}
    for line in lines:
        if m := TRAINED.search(line):
            out |= {"tokens": int(m[1]), "steps_s": float(m[2]), "tokens_per_s": int(m[3])}
        if m := STEPS.search(line):
            out["steps"] = int(m[2])
    clocks = [c for c in map(_clock_s, lines) if c is not None]
    if clocks:
        out["wall_s"] = (clocks[-1] - clocks[0]) % 86400  # a job over midnight wraps
    return out


def peer_figures(run: Path) -> dict:
    """From run_specforge.sh's run-summary.json: steps, tokens, wall time, tokens/s."""
    s = json.loads((run / "run-summary.json").read_text())
    return {
        "steps": s.get("steps"),
        "tokens": s.get("tokens"),
        "wall_s": s.get("wall_s_process"),
        "steps_s": s.get("train_s"),
        "tokens_per_s": s.get("steady_tokens_per_s") or s.get("tokens_per_s"),
        "epochs": s.get("epochs"),
    }


def _train_config(config: Mapping, variant: Mapping):
    from specbuild.drafter.train import TrainConfig  # torch: only the table needs it

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    merged = {**config["train"], **variant}
    return TrainConfig(**{k: v for k, v in merged.items() if k in names and v is not None})


def _peer_simulated(config: Mapping, results: Path, folder: str) -> tuple[float, float]:
    """The peer's drafter on our held-out rows, judged by the same teacher as ours: simulated
    acceptance at the bench's chain and over every trained step. Its lm_head rows are mapped
    onto our draft vocabulary (`warm_start`), the map each drafter was trained with."""
    from specbuild.drafter.train import evaluate_drafter

    train = config["train"]
    datasets = train.get("datasets") or list(config["datasets"])
    shards = sorted(
        str(p) for d in datasets for p in (results / "hidden" / d).glob("*.safetensors")
    )
    fingerprint = results / "target" / config["target"]["name"] / "fingerprint.json"
    cfg = dataclasses.replace(_train_config(config, {}), device="cpu", nproc=1)
    row = evaluate_drafter(
        drafter=folder,
        shards=shards,
        vocab=str(results / "vocab" / "vocab.safetensors"),
        target_fingerprint=str(fingerprint),
        config=cfg,
    )
    return simulated_accept_length(row, CHAIN_STEPS), row["acceptance_length"]


def _fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return ""
    return f"{x:,.{digits}f}" if isinstance(x, float) else f"{x:,}"


def _interval(r: pd.Series) -> str:
    return f"{r.ours_over_peer:.3f} [{r.ratio_lo:.3f}, {r.ratio_hi:.3f}]"


def table(args: argparse.Namespace) -> str:
    config = yaml.safe_load(Path(args.config).read_text())
    results, logs = Path(args.results), Path(args.logs)
    peers = pd.read_csv(results / "tables" / "peers.csv")
    bench = pd.read_csv(results / "tables" / "bench.csv")
    bench = bench[bench["chain"] != "baseline"]
    sets = list(config["bench"]["sets"])
    names = ["base", *config["train"]["variants"]]
    lines = []
    head = ["drafter", "trainer", "epochs", "steps", "job wall s", "tokens/s", "GPU-min"]
    head += ["simulated 3-1-4 / 7-step"] + [f"served {s}" for s in sets]
    head += [f"ours / SpecForge {s}" for s in sets]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for name in names:
        variant = {**config["train"], **config["train"]["variants"].get(name, {})}
        fig = train_figures(logs / "train" / f"{name}.log")
        best = best_train_row(results / "train" / name / "metrics.jsonl")
        served = [bench[(bench.drafter == name) & (bench.set == s)].accept_length for s in sets]
        ratio = []
        for s in sets:
            r = peers[(peers.drafter == name) & (peers.set == s)]
            ratio.append(_interval(r.iloc[0]) if len(r) else "")
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    "specbuild",
                    str(variant["epochs"]),
                    _fmt(fig.get("steps")),
                    _fmt(fig.get("wall_s")),
                    _fmt(fig.get("tokens_per_s")),
                    _fmt(fig["wall_s"] / 60, 1) if "wall_s" in fig else "",
                    f"{simulated_accept_length(best, CHAIN_STEPS):.3f} / "
                    f"{best['acceptance_length']:.3f}",
                    *[_fmt(float(x.iloc[0])) if len(x) else "" for x in served],
                    *ratio,
                ]
            )
            + " |"
        )
    for label, run in (
        ("specforge", args.specforge),
        ("specforge defaults", args.specforge_defaults),
    ):
        if not run or not (Path(run) / "run-summary.json").exists():
            continue
        fig = peer_figures(Path(run))
        served = [
            bench[(bench.drafter == "specforge") & (bench.set == s)].accept_length for s in sets
        ]
        sim = ""
        if label == "specforge":
            sim3, sim7 = _peer_simulated(config, results, str(Path(run) / "drafter"))
            sim = f"{sim3:.3f} / {sim7:.3f}"
        else:
            served = [pd.Series(dtype=float)] * len(
                sets
            )  # a timing run: its drafter is not benched
        lines.append(
            "| "
            + " | ".join(
                [
                    label,
                    "SpecForge",
                    str(fig.get("epochs") or ""),
                    _fmt(fig.get("steps")),
                    _fmt(fig.get("wall_s")),
                    _fmt(fig.get("tokens_per_s"), 0),
                    _fmt(fig["wall_s"] / 60, 1) if fig.get("wall_s") else "",
                    sim,
                    *[_fmt(float(x.iloc[0])) if len(x) else "" for x in served],
                    *[""] * len(sets),
                ]
            )
            + " |"
        )
    when = datetime.now().strftime("%Y-%m-%d %H:%M UTC")
    out = [f"Peers on {args.device}, {when}", "", *lines, ""]
    out += ["results/tables/peers.md (ours / SpecForge, paired, every drafter):", ""]
    out += [to_markdown(peers)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cmd, rest = argv[0], argv[1:]
    if cmd == "config":
        example, overlay, out = rest
        merged = merge(
            yaml.safe_load(Path(example).read_text()), yaml.safe_load(Path(overlay).read_text())
        )
        Path(out).write_text(yaml.safe_dump(merged, sort_keys=False))
    elif cmd == "settings":
        c = yaml.safe_load(Path(rest[0]).read_text())
        compared = {**c["train"], **c["train"]["variants"][COMPARED]}
        print(compared["epochs"], compared["lr"], " ".join(c["train"]["variants"]))
    elif cmd == "with-drafter":
        config, name, folder, out = rest
        c = yaml.safe_load(Path(config).read_text())
        c.setdefault("bench", {}).setdefault("drafters", {})[name] = folder
        Path(out).write_text(yaml.safe_dump(c, sort_keys=False))
    elif cmd == "table":
        p = argparse.ArgumentParser(prog="benchmarks.peers.summary table")
        for flag in ("--results", "--logs", "--config", "--device"):
            p.add_argument(flag, required=True)
        p.add_argument("--specforge")
        p.add_argument("--specforge-defaults")
        sys.stdout.write(table(p.parse_args(rest)))
    else:
        sys.exit(f"unknown command {cmd!r}: config, settings, with-drafter or table")


if __name__ == "__main__":
    main()
