"""fp8 hidden-state shards against bf16 on the same data: a benchmark, not a test.

    python -m benchmarks.fp8 [--config config/config.yaml] [--storages fp8 [fp8-g64]]
        [--errors fp8 fp8-g64 fp8-g32] [--limit 20] [--out results/perf/fp8] [--cores 2]
        [--reuse]

Needs the config built first (`make run`: its samples, generated answers, tokenized shards,
bf16 hidden shards and drafter). Then:

1. Quantization error, on the built bf16 shards (no model run): per layer (low, mid, high aux
   layers and `last`) and storage, the mean over tokens of ||x' - x|| / ||x|| and of cos(x', x),
   and for `last` how often the target's argmax through its lm_head (what the trainer's teacher
   and its eval use) stays the same. bf16 itself is the reference: its own rounding is not counted.
2. Acceptance: one Snakemake workdir per arm under OUT/<storage>/ (workflow files linked, the
   built results hard-linked with Snakemake's metadata, so nothing upstream reruns): `bf16`
   keeps the built shards and drafter and only benches again; each fp8 arm gets a config with
   `hidden.storage: <storage>` and rebuilds hidden, align, train, export and bench from the same
   tokenized shards. Every arm's bench is the config's, with each set's limit raised to
   `--limit` and no baseline (acceptance needs none): the CPU default's 12 requests cannot show
   a 2% difference. Arms run side by side, `--cores` split between them.
3. OUT/result.json and OUT/table.md: bytes per token; simulated acceptance, both the trainer's
   best eval row (its teacher: the arm's own, maybe fp8, `last`) and the arm's exported drafter
   on the bf16 shards' eval split (one teacher for every arm: what a served target would
   accept); served acceptance per set and over all sets with 95% bootstrap intervals; and
   fp8 / bf16 over the same requests with a paired interval.

Greedy decoding is lossless: both arms generate the same tokens, only the verify steps differ.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
import yaml

from benchmarks import PERF
from specbuild.bench.metrics import (
    acceptance_interval,
    acceptance_length,
    paired_ratio_interval,
)
from specbuild.drafter.teacher import read_target_weights
from specbuild.drafter.train import TrainConfig, evaluate_drafter
from specbuild.eagle.layers import AUX_LAYERS
from specbuild.hidden.fp8 import dequantize_fp8, parse_storage, quantize_fp8, scale_groups
from specbuild.hidden.shards import read_header, read_shard
from specbuild.infra.io import read_jsonl, write_json

__all__ = ["quantization_error", "make_arm", "run_arms", "compare", "main"]

GOAL_BYTES = 0.55  # the goal: fp8 bytes per token <= 0.55x bf16's ...
GOAL_ACCEPTANCE = 0.98  # ... at >= 0.98x its acceptance
LAYER_NAMES = ("low", "mid", "high", "last")
WORKFLOW_FILES = (
    "Snakefile",
    "rules",
    "scripts",
    "config",
    "resources",
    "profiles",
    "envs",
    "report",
)
# Built results an fp8 arm rebuilds from the tokenized shards (everything else is linked).
REBUILT = ("hidden", "align", "train", "drafter", "bench", "tables", "plots", "report.html")


def _argmax(x: torch.Tensor, head: torch.Tensor, rows: int = 512) -> torch.Tensor:
    """argmax of x @ head.T [T], `rows` at a time (a [T, V] logits matrix is GBs)."""
    return torch.cat([(x[i : i + rows] @ head.T).argmax(-1) for i in range(0, len(x), rows)])


def quantization_error(
    shards: list[Path], target_dir: Path, storages: list[str], max_tokens: int = 4096
) -> dict[str, dict[str, dict[str, float]]]:
    """{storage: {layer: {rel_error, cosine[, argmax_agreement]}}} over the first `max_tokens`
    tokens of the bf16 `shards`."""
    aux, last, n = [], [], 0
    for path in shards:
        t, meta = read_shard(path)
        if meta["dtype"] != "bf16":
            raise ValueError(f"{path}: quantization error is measured from bf16 shards")
        take = min(max_tokens - n, t["last"].shape[0])
        aux.append(t["aux"][:take].float())
        last.append(t["last"][:take].float())
        n += take
        if n >= max_tokens:
            break
    aux_x, last_x = torch.cat(aux), torch.cat(last)  # shapes: [T, 3H], [T, H]
    hidden = last_x.shape[1]
    head = read_target_weights(target_dir, ["lm_head.weight"])["lm_head.weight"].float()
    want_top = _argmax(last_x, head)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for storage in storages:
        groups = scale_groups(hidden, parse_storage(storage)[1])
        back_aux = dequantize_fp8(*quantize_fp8(aux_x, AUX_LAYERS * groups))
        back_last = dequantize_fp8(*quantize_fp8(last_x, groups))
        rows = {}
        for i, name in enumerate(LAYER_NAMES):
            cols = slice(i * hidden, (i + 1) * hidden)
            x, y = (last_x, back_last) if name == "last" else (aux_x[:, cols], back_aux[:, cols])
            rel = (y - x).norm(dim=1) / x.norm(dim=1).clamp_min(1e-30)
            rows[name] = {
                "rel_error": round(float(rel.mean()), 5),
                "cosine": round(float(torch.nn.functional.cosine_similarity(x, y).mean()), 6),
            }
        top = _argmax(back_last, head)
        rows["last"]["argmax_agreement"] = round(float((top == want_top).float().mean()), 5)
        out[storage] = rows
    return {"tokens": n, "storages": out}


def _link_tree(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> None:
    """Hard-link every file of `src` under `dst` (same inode, same mtime), but `skip`'s top
    entries. Jobs that rerun remove their outputs first, so the built tree is never written."""
    for entry in src.iterdir():
        if entry.name in skip:
            continue
        if entry.is_dir():
            shutil.copytree(entry, dst / entry.name, copy_function=os.link, dirs_exist_ok=True)
        else:
            dst.mkdir(parents=True, exist_ok=True)
            os.link(entry, dst / entry.name)


def make_arm(repo: Path, workdir: Path, config: dict, storage: str, limit: int) -> Path:
    """A workdir whose `snakemake` builds `config` with `hidden.storage: storage` and raised
    bench limits, from `repo`'s built results."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    for name in WORKFLOW_FILES:
        (workdir / name).symlink_to(repo / name, target_is_directory=(repo / name).is_dir())
    cfg = json.loads(json.dumps(config))  # a deep copy
    cfg["hidden"]["storage"] = storage
    cfg["bench"]["baseline"] = False
    for s in cfg["bench"]["sets"].values():
        s["limit"] = limit
    (workdir / "arm.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    # results/perf (these arms among them) holds measurements, never a workflow input
    results = repo / "results"
    skip = (PERF.name,)
    if workdir.is_relative_to(results):
        skip += (workdir.relative_to(results).parts[0],)
    _link_tree(repo / "results", workdir / "results", skip + (() if storage == "bf16" else REBUILT))
    # Snakemake's records of the built jobs (params, code, inputs), copied: it rewrites them
    # in place. Without them a reused output would be trusted by its mtime alone.
    shutil.copytree(repo / ".snakemake" / "metadata", workdir / ".snakemake" / "metadata")
    return workdir


def run_arms(workdirs: dict[str, Path], cores: int) -> dict[str, dict]:
    """Run every arm's snakemake side by side; {storage: {wall_s, cpu_s}} (CPU time of the
    jobs, children included, summed)."""
    exe = Path(sys.executable).with_name("snakemake")
    each = max(1, cores // len(workdirs))
    procs = {}
    for storage, wd in workdirs.items():
        log = open(wd / "snakemake.log", "w")  # noqa: SIM115 (closed when the process ends)
        cmd = [str(exe), "--configfile", "arm.yaml", "--cores", str(each), "all"]
        procs[storage] = (subprocess.Popen(cmd, cwd=wd, stdout=log, stderr=subprocess.STDOUT), log)
        procs[storage] += (time.perf_counter(),)
    times = {}
    for storage, (proc, log, start) in procs.items():
        _, status, usage = os.wait4(proc.pid, 0)
        log.close()
        times[storage] = {
            "wall_s": round(time.perf_counter() - start, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        }
        if os.waitstatus_to_exitcode(status):
            raise RuntimeError(
                f"arm {storage}: snakemake failed, see {workdirs[storage]}/snakemake.log"
            )
    return times


def _rows(path: Path) -> dict[tuple, dict]:
    return {
        (r["set"], r["prompt_id"], r["turn"]): r for r in read_jsonl(path) if r["phase"] == "bench"
    }


def _accept(rows: list[dict], chain: str) -> dict:
    c = [r["completion_tokens"] for r in rows]
    v = [r["verify_steps"] for r in rows]
    lo, hi = acceptance_interval(c, v)
    accepted = acceptance_length(sum(c), sum(v), chain)
    return {"requests": len(rows), "acceptance": accepted, "lo": lo, "hi": hi}


def _tokens(shard: Path) -> int:
    """Tokens of a shard, from its header (the file itself can be GBs)."""
    _, shape = read_header(shard)[0]["input_ids"]
    return math.prod(shape)


def compare(
    workdirs: dict[str, Path], chain: str, train: TrainConfig, drafter: str = "base"
) -> dict:
    """Per arm: bytes per token, simulated acceptance (the trainer's, and its exported drafter's
    on the bf16 shards' eval split: one teacher for all), served acceptance; fp8 arms / bf16."""
    out = {}
    ref = workdirs["bf16"] / "results"
    ref_shards = [str(p) for p in sorted((ref / "hidden").glob("*/*.safetensors"))]
    fingerprint = str(next((ref / "target").glob("*/fingerprint.json")))
    ref_rows = _rows(workdirs["bf16"] / f"results/bench/hf/{drafter}/{chain}.jsonl")
    for storage, wd in workdirs.items():
        shards = sorted((wd / "results" / "hidden").glob("*/*.safetensors"))
        tokens = sum(_tokens(p) for p in shards)
        metrics = wd / "results" / "train" / drafter / "metrics.jsonl"
        evals = [r for r in read_jsonl(metrics) if "acceptance_length" in r]
        rows = _rows(wd / f"results/bench/hf/{drafter}/{chain}.jsonl")
        sets = sorted({k[0] for k in rows})
        arm = {
            "bytes_per_token": sum(p.stat().st_size for p in shards) / tokens,
            "simulated": max(r["acceptance_length"] for r in evals),  # the trainer's best
            "simulated_bf16_teacher": evaluate_drafter(
                drafter=wd / "results" / "drafter" / drafter,
                shards=ref_shards,
                vocab=str(ref / "vocab" / "vocab.safetensors"),
                target_fingerprint=fingerprint,
                config=train,
            )["acceptance_length"],
            "served": {s: _accept([r for k, r in rows.items() if k[0] == s], chain) for s in sets},
        }
        arm["served"]["all"] = _accept(list(rows.values()), chain)
        if storage != "bf16":
            for s in [*sets, "all"]:
                keys = sorted(k for k in rows if k in ref_rows and (s == "all" or k[0] == s))
                pairs = [(ref_rows[k], rows[k]) for k in keys]
                ratio, lo, hi = paired_ratio_interval(
                    [a["completion_tokens"] for a, _ in pairs],
                    [a["verify_steps"] for a, _ in pairs],
                    [b["completion_tokens"] for _, b in pairs],
                    [b["verify_steps"] for _, b in pairs],
                )
                arm["served"][s] |= {"vs_bf16": ratio, "vs_bf16_lo": lo, "vs_bf16_hi": hi}
        out[storage] = arm
    for arm in out.values():
        arm["bytes_vs_bf16"] = arm["bytes_per_token"] / out["bf16"]["bytes_per_token"]
        arm["simulated_vs_bf16"] = arm["simulated"] / out["bf16"]["simulated"]
        arm["simulated_bf16_teacher_vs_bf16"] = (
            arm["simulated_bf16_teacher"] / out["bf16"]["simulated_bf16_teacher"]
        )
    return out


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(result: dict) -> str:
    arms, quant = result["arms"], result["quantization"]
    sets = [s for s in next(iter(arms.values()))["served"] if s != "all"] + ["all"]
    lines = [
        "| storage | bytes/token | vs bf16 | simulated (own teacher) | vs bf16 | simulated "
        "(bf16 teacher) | vs bf16 | "
        + " | ".join(f"served {s} (interval)" for s in sets)
        + " | served, all / bf16 (paired interval) |",
        "|---" * (8 + len(sets)) + "|",
    ]
    for storage, a in arms.items():
        served = [
            f"{_fmt(a['served'][s]['acceptance'])} ({_fmt(a['served'][s]['lo'])}-"
            f"{_fmt(a['served'][s]['hi'])})"
            for s in sets
        ]
        al = a["served"]["all"]
        paired = (
            f"{_fmt(al['vs_bf16'])} ({_fmt(al['vs_bf16_lo'])}-{_fmt(al['vs_bf16_hi'])})"
            if "vs_bf16" in al
            else "-"
        )
        lines.append(
            f"| {storage} | {a['bytes_per_token']:.0f} | {a['bytes_vs_bf16']:.3f} | "
            f"{a['simulated']:.3f} | {a['simulated_vs_bf16']:.3f} | "
            f"{a['simulated_bf16_teacher']:.3f} | {a['simulated_bf16_teacher_vs_bf16']:.3f} | "
            + " | ".join(served)
            + f" | {paired} |"
        )
    lines += ["", f"Quantization error over {quant['tokens']} tokens of the bf16 shards:", ""]
    lines += ["| storage | " + " | ".join(f"{n} rel. error / cosine" for n in LAYER_NAMES)
              + " | last: argmax kept |", "|---" * (len(LAYER_NAMES) + 2) + "|"]  # fmt: skip
    for storage, rows in quant["storages"].items():
        cells = [f"{rows[n]['rel_error']:.4f} / {rows[n]['cosine']:.5f}" for n in LAYER_NAMES]
        lines.append(
            f"| {storage} | " + " | ".join(cells) + f" | {rows['last']['argmax_agreement']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--storages", nargs="+", default=["fp8"], help="fp8 arms beside bf16")
    ap.add_argument(
        "--errors",
        nargs="+",
        default=["fp8", "fp8-g64", "fp8-g32"],
        help="storages whose quantization error is measured (cheap: no arm of their own)",
    )
    ap.add_argument("--limit", type=int, default=20, help="prompts per bench set")
    ap.add_argument("--out", default=str(PERF / "fp8"))
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--reuse", action="store_true", help="compare the arms already built")
    args = ap.parse_args(argv)
    repo = Path.cwd()
    config = yaml.safe_load(Path(args.config).read_text())
    if config["hidden"]["storage"] != "bf16":
        raise SystemExit(f"{args.config}: hidden.storage must be bf16, the reference arm")
    chain = config["bench"]["chains"][0]
    # the base recipe's keys; the schema's defaults are TrainConfig's
    train = TrainConfig.from_params(
        {k: v for k, v in config["train"].items() if k not in ("datasets", "variants")}
    )
    target_dir = next((repo / "results" / "target").iterdir())
    built = sorted((repo / "results" / "hidden").glob("*/*.safetensors"))
    if not built or not (repo / "results" / "drafter" / "base").is_dir():
        raise SystemExit(f"build {args.config} first (make run CONFIG={args.config})")
    out = Path(args.out).resolve()
    storages = ["bf16", *args.storages]
    quant = quantization_error(built, target_dir, list(dict.fromkeys(args.storages + args.errors)))
    workdirs = {s: out / s for s in storages}
    times = {}
    if not args.reuse:
        for s in storages:
            make_arm(repo, workdirs[s], config, s, args.limit)
        times = run_arms(workdirs, args.cores)
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_average": os.getloadavg(),
        "config": args.config,
        "chain": chain,
        "limit": args.limit,
        "times": times,
        "quantization": quant,
        "arms": compare(workdirs, chain, train),
        "goal": {"bytes_vs_bf16": GOAL_BYTES, "acceptance_vs_bf16": GOAL_ACCEPTANCE},
    }
    write_json(out / "result.json", result)
    (out / "table.md").write_text(table(result))
    print(table(result))


if __name__ == "__main__":
    main()
