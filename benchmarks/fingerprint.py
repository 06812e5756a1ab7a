"""The target fingerprint's cost: every byte hashed against the sampled digest big folders get.

Writes `--files` safetensors files of `--gb-per-file` GB of random bytes into a scratch folder,
then times specbuild.target's weight digest both ways over the same files (page-cached: the
second read of each), and projects both to `--project-gb` (Kimi-K2.5's ~600 GB by default).
One core does the hashing, as in the `target` job. Prints a BENCHMARKS.md row and writes
results/perf/fingerprint/result.json.

    python -m benchmarks.fingerprint --files 2 --gb-per-file 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import PERF
from specbuild.infra.io import write_json
from specbuild.infra.safetensors_file import save_tensors
from specbuild.target import SAMPLE_BYTES, SAMPLES_PER_FILE, _sampled_digest, _sha256_file


def _write(folder: Path, files: int, nbytes: int) -> list[Path]:
    paths = []
    for i in range(files):
        path = folder / f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        data = torch.frombuffer(bytearray(os.urandom(nbytes)), dtype=torch.uint8)
        save_tensors({"weight": data}, str(path))
        paths.append(path)
    return paths


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--gb-per-file", type=float, default=1.0)
    ap.add_argument("--project-gb", type=float, default=600.0)
    ap.add_argument("--files-projected", type=int, default=64, help="files of the projected folder")
    ap.add_argument("--scratch", default=None, help="folder for the files (default: a temp dir)")
    ap.add_argument("--out", default=str(PERF / "fingerprint" / "result.json"))
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
        shards = _write(Path(tmp), args.files, int(args.gb_per_file * 1e9))
        total = sum(p.stat().st_size for p in shards)

        def full() -> None:
            h = hashlib.sha256()
            for shard in shards:
                _sha256_file(shard, h)

        def sampled() -> None:
            _sampled_digest(shards, hashlib.sha256())

        full()  # page the files in: the timed reads below are cached
        full_s = _timed(full)
        sampled_s = _timed(sampled)
    rate = total / full_s / 1e9
    sampled_read = SAMPLES_PER_FILE * SAMPLE_BYTES * args.files_projected
    result = {
        "files": args.files,
        "bytes": total,
        "full_s": round(full_s, 3),
        "full_gb_per_s": round(rate, 3),
        "sampled_s": round(sampled_s, 4),
        "projected_gb": args.project_gb,
        "projected_full_min": round(args.project_gb / rate / 60, 1),
        "projected_sampled_read_gb": round(sampled_read / 1e9, 2),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    write_json(args.out, result)
    print(json.dumps(result, indent=1))
    print(
        f"| {total / 1e9:.1f} GB in {args.files} files | full sha256 {full_s:.2f} s "
        f"({rate:.2f} GB/s) | sampled {sampled_s * 1e3:.1f} ms | {args.project_gb:.0f} GB whole: "
        f"~{result['projected_full_min']} min; sampled reads {result['projected_sampled_read_gb']}"
        f" GB |"
    )
    return result


if __name__ == "__main__":
    main()
