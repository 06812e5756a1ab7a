"""Benchmark of stage `hidden` (a benchmark, not a test): extraction throughput against a bare
forward pass over the very same batches, and bytes per token on disk.

    python -m benchmarks.extract [--target-dir results/target/<name>] [--device cpu]
    python -m benchmarks.extract --engine sglang [--preset llama8b] ...   # one GPU

`--engine sglang` measures, in one process on one GPU and on the same mixed-length batches:
SGLang's bare prefill (its model runner, aux capture off), the full SGLang extraction (capture,
bf16/fp8 packing on the GPU, copies behind the compute, shard write) and the full transformers
extraction (same steps, HF forward). `--preset llama8b` runs a Llama-3.1-8B-shaped target with
random weights (SGLang's load_format dummy; speed does not depend on weight values), built
from its config alone; otherwise the materialized target folder.

The bare pass runs the target's base model (no lm_head, no hidden-state capture) on the batches
`plan_forward_batches` makes; extraction runs the stage's own full path (`write_features`): aux
capture, bf16 (or fp8) conversion, copies into the shard file, checksums and checks, the file
renamed into place. Their tokens/s ratio is the cost of extraction over the forward pass it
cannot avoid (goal >= 0.9). Each variant runs `--repeats` times,
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

import specbuild
from benchmarks import PERF
from specbuild.eagle.target_info import read_target_info
from specbuild.eagle.text_model import text_config
from specbuild.hidden.core import (
    ShardFormat,
    plan_forward_batches,
    resolve_layer_ids,
    write_features,
)
from specbuild.hidden.hf import HFFeatureBackend
from specbuild.hidden.tokens import TokenShard
from specbuild.infra.io import write_json

__all__ = ["synthetic_shard", "run_extract_bench", "run_sglang_extract_bench", "main"]


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


def _extract_run(
    shard: TokenShard,
    backend,
    hidden: int,
    layer_ids: list[int],
    storage: str,
    batch_tokens: int,
    folder: str | os.PathLike,
    sizes: dict[str, float],
    phases: dict[str, list[dict[str, float]]] | None = None,
    host: Callable[[], dict[str, float]] | None = None,
) -> Callable[[], None]:
    """One timed extraction: the stage's whole path into a shard file under `folder`; its bytes
    per token go to sizes[storage], and where its time went to phases[<backend>_<storage>]
    (the caller's time in the backend, blocked on host copies, sealing; plus `host()`'s
    counters, taken before and after)."""

    def run() -> None:
        path = Path(folder) / f"{backend.name}-{storage}.safetensors"
        meta = {
            "layer_ids": json.dumps(layer_ids),
            "backend": backend.name,
            "target_fingerprint": "bench",
            "tokenizer_fingerprint": "bench",
            "dtype": storage,
            "specbuild_version": specbuild.__version__,
        }
        before = host() if host else {}
        fmt = ShardFormat(hidden_size=hidden, storage=storage)
        written = write_features(path, shard, backend, meta, fmt, batch_tokens=batch_tokens)
        if phases is not None:
            after = host() if host else {}
            phases.setdefault(f"{backend.name}_{storage}", []).append(
                {
                    "in_backend": written.forward_s,
                    "waiting_for_host_copies": written.wait_s,
                    "seal": written.seal_s,
                    **_host_delta(before, after),
                }
            )
        sizes[storage] = os.path.getsize(path) / shard.num_tokens
        path.unlink()

    return run


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
    batches = [[shard.sample(i) for i in b] for b in plan_forward_batches(lengths, batch_tokens)]

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

    sizes: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        bare()  # warm-up: first-call allocations and kernel selection are not throughput
        runs = {"bare": bare}
        for storage in ("bf16", "fp8"):
            runs[storage] = _extract_run(
                shard, backend, info.hidden_size, ids, storage, batch_tokens, tmp, sizes
            )
        wall: dict[str, list[float]] = {k: [] for k in runs}
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(repeats):
            for k, fn in runs.items():
                _timed(fn, wall[k], cpu[k])
    tokens = shard.num_tokens
    tps = {k: tokens / min(v) for k, v in wall.items()}
    cpu_tps = {k: tokens / min(v) for k, v in cpu.items()}
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


def _random_target(folder: Path, preset: str) -> Path:
    """A config-only folder of a drafter-bench preset's target shapes (weights: random)."""
    from benchmarks.synthetic import PRESETS, target_config

    folder.mkdir(parents=True, exist_ok=True)
    write_json(
        folder / "config.json", {**target_config(PRESETS[preset]), "torch_dtype": "bfloat16"}
    )
    return folder


def _hf_random(folder: Path, device: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    # a preset's config, written above: no remote code (passed, so nothing ever prompts)
    cfg = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # initialise in bf16: an fp32 8B would take 32 GB
    try:
        with torch.device(device):
            return AutoModelForCausalLM.from_config(cfg).eval()
    finally:
        torch.set_default_dtype(default)


def run_sglang_extract_bench(
    *,
    target_dir: str | os.PathLike | None,
    preset: str | None = None,
    tokenizer_dir: str | os.PathLike | None = None,
    server_args: dict | None = None,
    mem_fraction_static: float = 0.5,
    batch_tokens: int = 16384,
    samples: int = 256,
    min_len: int = 64,
    max_len: int = 1024,
    repeats: int = 3,
    scratch: str | os.PathLike | None = None,
    profile: str | os.PathLike | None = None,
) -> dict:
    """SGLang bare prefill vs SGLang extraction vs transformers extraction (module doc); with
    `profile` a folder, one more SGLang bf16 extraction runs under torch.profiler (`_profile`)."""
    from specbuild.engines.runner import SGLangRunner
    from specbuild.hidden.hf import HFFeatureBackend
    from specbuild.hidden.sglang import SGLangFeatureBackend

    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        args = {"attention_backend": "triton", "sampling_backend": "pytorch", **(server_args or {})}
        if preset:
            folder = _random_target(Path(tmp) / preset, preset)
            args.update(load_format="dummy", dtype="bfloat16", context_length=max_len + 8)
            if tokenizer_dir:  # SGLang loads a tokenizer with every runner; any one will do
                args["tokenizer_path"] = str(tokenizer_dir)
        else:
            folder = Path(target_dir)
        cfg = json.loads((folder / "config.json").read_text())
        cfg = text_config(cfg)
        hidden, vocab = int(cfg["hidden_size"]), int(cfg["vocab_size"])
        ids = resolve_layer_ids([], int(cfg["num_hidden_layers"]))
        runner = SGLangRunner(
            folder, layer_ids=ids, server_args=args, mem_fraction_static=mem_fraction_static
        )
        sglang = SGLangFeatureBackend(runner)
        if preset:
            hf_model = _hf_random(folder, "cuda")
        else:
            from specbuild.target import load_target_model

            hf_model = load_target_model(folder, dtype="bfloat16", device="cuda")
        hf = HFFeatureBackend(hf_model, ids)
        shard = synthetic_shard(samples, min_len=min_len, max_len=max_len, vocab_size=vocab)
        offsets = shard.offsets.tolist()
        lengths = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
        plan = plan_forward_batches(lengths, batch_tokens)
        batches = [[shard.sample(i) for i in b] for b in plan]

        def host() -> dict[str, float]:
            return dict(runner.host_s)

        sizes: dict[str, float] = {}
        phases: dict[str, list[dict[str, float]]] = {}

        def bare() -> None:
            before = host()
            for batch in batches:
                runner.prefill(batch, capture=False)
            torch.cuda.synchronize()
            after = host()
            phases.setdefault("sglang_bare", []).append(_host_delta(before, after))

        def extract(backend, storage: str) -> Callable[[], None]:
            return _extract_run(
                shard,
                backend,
                hidden,
                ids,
                storage,
                batch_tokens,
                tmp,
                sizes,
                phases,
                host if backend is sglang else None,
            )

        runs = {
            "sglang_bare": bare,
            "sglang_bf16": extract(sglang, "bf16"),
            "sglang_fp8": extract(sglang, "fp8"),
            "hf_bf16": extract(hf, "bf16"),
            "hf_fp8": extract(hf, "fp8"),
        }
        for fn in runs.values():  # warm-up: kernel compiles, first allocations, pinning
            fn()
        wall: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(repeats):
            for k, fn in runs.items():
                _timed(fn, wall[k], [])
        if profile:
            _profile(runs["sglang_bf16"], Path(profile))
        runner.close()
    tokens = shard.num_tokens
    tps = {k: tokens / min(v) for k, v in wall.items()}
    return {
        "engine": "sglang",
        "target": preset or Path(target_dir).name,
        "weights": "random (load_format dummy)" if preset else "real",
        "device": torch.cuda.get_device_name(),
        "hidden_size": hidden,
        "layer_ids": ids,
        "samples": samples,
        "tokens": tokens,
        "padded_tokens": sum(len(b) * lengths[b[0]] for b in plan),
        "batches": len(batches),
        "batch_tokens": batch_tokens,
        "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
        "ratio_to_sglang_bare": {k: round(v / tps["sglang_bare"], 3) for k, v in tps.items()},
        "sglang_over_hf": {
            k: round(tps[f"sglang_{k}"] / tps[f"hf_{k}"], 2) for k in ("bf16", "fp8")
        },
        "bytes_per_token": {k: round(v, 1) for k, v in sizes.items()},
        # where the caller's thread spent the best timed run of each path, in seconds: in the
        # backend, blocked on host copies, sealing (checksums left, NaN/Inf counts, checks);
        # sglang_*: SGLang runner host time building requests, in its step, clearing pools
        "phases_best": {k: _rounded(phases[k][_best(wall[k])]) for k in phases if k in wall},
        "host_threads": os.cpu_count(),
        "seconds_best": {k: round(min(v), 3) for k, v in wall.items()},
        "repeats": repeats,
    }


def _host_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The SGLang runner's host seconds (`SGLangRunner.host_s`) spent between two readings."""
    return {f"sglang_{k}": after[k] - before[k] for k in after}


def _best(times: list[float]) -> int:
    """Index of the best timed run (the warm-up run is not in `times`: the +1 skips it)."""
    return times.index(min(times)) + 1


def _rounded(phase: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in phase.items()}


def _profile(run: Callable[[], None], folder: Path) -> None:
    """One run under torch.profiler (CPU and CUDA activity, every thread): the ops by total CPU
    time and by CUDA time as text, and a Chrome trace (ui.perfetto.dev) in `folder`. Where the
    time beyond the bare prefill goes is the question it answers (BENCHMARKS.md)."""
    from torch.profiler import ProfilerActivity, profile

    folder.mkdir(parents=True, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    table = prof.key_averages()
    text = "\n\n".join(
        table.table(sort_by=key, row_limit=40) for key in ("cpu_time_total", "cuda_time_total")
    )
    (folder / "profile.txt").write_text(text)
    prof.export_chrome_trace(str(folder / "profile.trace.json"))
    print(table.table(sort_by="cpu_time_total", row_limit=25))


def _sglang_markdown(r: dict) -> str:
    rows = ["| path | tokens/s | vs SGLang bare prefill |", "|---|---|---|"]
    names = {
        "sglang_bare": "SGLang bare prefill (capture off)",
        "sglang_bf16": "SGLang extraction, bf16 shard written",
        "sglang_fp8": "SGLang extraction, fp8 shard written",
        "hf_bf16": "transformers extraction, bf16 shard written",
        "hf_fp8": "transformers extraction, fp8 shard written",
    }
    for k, name in names.items():
        rows.append(
            f"| {name} | {r['tokens_per_s'][k]:,.0f} | {r['ratio_to_sglang_bare'][k]:.3f} |"
        )
    return "\n".join(rows)


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
    ap.add_argument("--out", default=str(PERF / "extract" / "extract.json"))
    ap.add_argument("--engine", choices=["hf", "sglang"], default="hf")
    ap.add_argument("--preset", help="sglang engine: random-weight target of a preset's shapes")
    ap.add_argument("--tokenizer-dir", help="sglang engine with --preset: any tokenizer folder")
    ap.add_argument("--mem-fraction-static", type=float, default=0.5)
    ap.add_argument("--scratch", help="folder for the shards written while timing")
    ap.add_argument("--profile", help="sglang engine: folder for a profile of one extraction")
    args = ap.parse_args(argv)
    target_dir = args.target_dir
    # the same synthetic batches for either engine
    batches = {k: getattr(args, k) for k in ("batch_tokens", "samples", "min_len", "max_len")}
    if args.engine == "sglang":
        result = run_sglang_extract_bench(
            target_dir=target_dir,
            preset=args.preset,
            tokenizer_dir=args.tokenizer_dir,
            mem_fraction_static=args.mem_fraction_static,
            repeats=args.repeats,
            scratch=args.scratch,
            profile=args.profile,
            **batches,
        )
        table = _sglang_markdown(result)
    else:
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
            repeats=args.repeats,
            **batches,
        )
        table = _markdown(result)
    write_json(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "layer_ids"}, indent=None))
    print(table)
    return result


if __name__ == "__main__":
    main()
