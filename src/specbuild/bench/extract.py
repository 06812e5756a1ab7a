"""Benchmark of stage `hidden` (a benchmark, not a test): extraction throughput against a bare
forward pass over the very same batches, and bytes per token on disk.

    python -m specbuild.bench.extract [--target-dir results/target/<name>] [--device cpu]

The bare pass runs the target's base model (no lm_head, no hidden-state capture) on the batches
`plan_batches` makes; extraction runs the full path: HF backend with aux capture, copies to CPU,
bf16 (or fp8) conversion into the shard buffers. Their tokens/s ratio is the cost of extraction
over the forward pass it cannot avoid (goal >= 0.9). Each variant runs `--repeats` times,
interleaved, and the best time counts. On a shared machine wall time measures the neighbours
too; the CPU time of this process (`--threads 1` keeps OpenMP spin-waits out of it) measures
the work, so both are reported; on a GPU only wall time means anything.

Bytes per token compare our shard files with the usual one-file-per-sample format, which stores
3 aux + last states in bf16: 4 * H * 2 = 8H bytes per token.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from specbuild.hidden.extract import extract_features, plan_batches, resolve_layer_ids
from specbuild.hidden.hf import HFFeatureBackend
from specbuild.hidden.shards import write_shard
from specbuild.hidden.tokens import TokenShard
from specbuild.io import write_json
from specbuild.target import read_target_info

__all__ = ["synthetic_shard", "run_extract_bench", "main"]


def synthetic_shard(
    n: int, *, min_len: int, max_len: int, vocab_size: int, seed: int = 0
) -> TokenShard:
    """Seeded random samples: speed does not depend on which ids, only on how many."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    total = int(offsets[-1])
    return TokenShard(
        path="<synthetic>",
        ids=[f"bench-{i}" for i in range(n)],
        input_ids=torch.randint(0, vocab_size, (total,), generator=g, dtype=torch.int32),
        loss_mask=torch.ones(total, dtype=torch.uint8),
        offsets=offsets,
    )


def _timed(fn: Callable[[], object], wall: list[float], cpu: list[float]) -> None:
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    wall.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)


def run_extract_bench(
    *,
    target_dir: str | os.PathLike,
    device: str = "cpu",
    dtype: str = "float32",
    batch_tokens: int = 2048,
    samples: int = 32,
    min_len: int = 64,
    max_len: int = 256,
    repeats: int = 3,
) -> dict:
    target_dir = Path(target_dir)
    info = read_target_info(target_dir / "fingerprint.json")
    ids = resolve_layer_ids([], info.num_hidden_layers)
    backend = HFFeatureBackend.from_folder(target_dir, layer_ids=ids, dtype=dtype, device=device)
    shard = synthetic_shard(samples, min_len=min_len, max_len=max_len, vocab_size=info.vocab_size)
    offsets = shard.offsets.tolist()
    lengths = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    batches = [[shard.sample(i) for i in b] for b in plan_batches(lengths, batch_tokens)]

    @torch.no_grad()
    def bare() -> None:
        for batch in batches:
            width = max(len(s) for s in batch)
            x = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for b, s in enumerate(batch):
                x[b, : len(s)], mask[b, : len(s)] = torch.tensor(s), 1
            padded = min(len(s) for s in batch) < width
            out = backend.base(
                input_ids=x.to(backend.device),
                attention_mask=mask.to(backend.device) if padded else None,
                use_cache=False,
            )
            out.last_hidden_state.cpu()  # same device sync as extraction's copy back

    kept: dict[str, dict] = {}

    def extract(storage: str) -> Callable[[], None]:
        def run() -> None:
            kept[storage] = extract_features(
                shard,
                backend,
                hidden_size=info.hidden_size,
                storage=storage,
                batch_tokens=batch_tokens,
            )[0]

        return run

    bare()  # warm-up: first-call allocations and kernel selection are not throughput
    runs = {"bare": bare, "bf16": extract("bf16"), "fp8": extract("fp8")}
    wall: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for k, fn in runs.items():
            _timed(fn, wall[k], cpu[k])
    tokens = shard.num_tokens
    tps = {k: tokens / min(v) for k, v in wall.items()}
    cpu_tps = {k: tokens / min(v) for k, v in cpu.items()}
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for storage, tensors in kept.items():
            path = Path(tmp) / f"{storage}.safetensors"
            write_shard(path, tensors, {"dtype": storage})
            sizes[storage] = os.path.getsize(path) / tokens
    hidden = info.hidden_size
    return {
        "target": info.name,
        "device": str(backend.device),
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "samples": samples,
        "tokens": tokens,
        "padded_tokens": sum(len(b) * max(len(s) for s in b) for b in batches),
        "batches": len(batches),
        "batch_tokens": batch_tokens,
        "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
        "ratio_bf16": round(tps["bf16"] / tps["bare"], 3),
        "ratio_fp8": round(tps["fp8"] / tps["bare"], 3),
        "tokens_per_cpu_s": {k: round(v, 1) for k, v in cpu_tps.items()},
        "ratio_bf16_cpu_time": round(cpu_tps["bf16"] / cpu_tps["bare"], 3),
        "ratio_fp8_cpu_time": round(cpu_tps["fp8"] / cpu_tps["bare"], 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "bytes_per_token": {k: round(v, 1) for k, v in sizes.items()},
        "bytes_per_token_one_file_per_sample_bf16": 8 * hidden,
        "hidden_size": hidden,
        "layer_ids": ids,
        "repeats": repeats,
    }


def _markdown(r: dict) -> str:
    ref = r["bytes_per_token_one_file_per_sample_bf16"]
    rows = [
        "| path | tokens/s (wall) | vs bare | tokens/CPU-s | vs bare | bytes/token | vs 8H |",
        "|---|---|---|---|---|---|---|",
        f"| bare forward (base model) | {r['tokens_per_s']['bare']} | 1.000 "
        f"| {r['tokens_per_cpu_s']['bare']} | 1.000 | - | - |",
    ]
    for k in ("bf16", "fp8"):
        b = r["bytes_per_token"][k]
        rows.append(
            f"| extract, aux {k} | {r['tokens_per_s'][k]} | {r[f'ratio_{k}']:.3f} "
            f"| {r['tokens_per_cpu_s'][k]} | {r[f'ratio_{k}_cpu_time']:.3f} | {b} "
            f"| {b / ref:.3f} |"
        )
    rows.append(f"| one-file-per-sample (3 aux + last, bf16) | - | - | - | - | {ref} | 1.000 |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target-dir", help="materialized target folder (default: the only one)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--min-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default="results/bench/extract.json")
    args = ap.parse_args(argv)
    target_dir = args.target_dir
    if target_dir is None:
        found = sorted(Path("results/target").glob("*/fingerprint.json"))
        if len(found) != 1:
            ap.error(
                f"found {len(found)} materialized targets under results/target/; pass "
                "--target-dir (build one with `snakemake target`)"
            )
        target_dir = found[0].parent
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run_extract_bench(
        target_dir=target_dir,
        device=args.device,
        dtype=args.dtype,
        batch_tokens=args.batch_tokens,
        samples=args.samples,
        min_len=args.min_len,
        max_len=args.max_len,
        repeats=args.repeats,
    )
    write_json(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "layer_ids"}, indent=None))
    print(_markdown(result))
    return result


if __name__ == "__main__":
    main()
