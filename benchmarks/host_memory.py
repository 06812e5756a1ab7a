"""Host memory of an engine-bound job: the peak resident memory of this process and every
process under it while an engine loads a materialized target and runs one request, with the
target's weights size beside it. What `specbuild.workflow.scheduling`'s `mem_mb` formula is
fitted to (docs/clusters.md, "Host memory").

    python -m benchmarks.host_memory TARGET --engine runner [--options JSON] [--out rows.jsonl]

`--engine runner`: the hidden stage's feature engine (`hidden.backend` sglang: SGLang's model
runner in this process; `--backend hf` the transformers one), one batch of 2,048 tokens.
`--engine server`: the generate stage's SGLang server (a process tree), one chat request.
Anonymous memory (what a cgroup cannot reclaim) and file-backed memory (the weights' mapped
pages, reclaimable page cache) are reported apart; `--mem-mb` sizes from the anonymous peak.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["MemoryPeak", "TreeSampler", "tree_rss_kb"]


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tasks:
        try:
            kids += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return kids


def _rss_kb(pid: int) -> tuple[int, int]:
    """(RssAnon, RssFile + RssShmem) of one process in kB; (0, 0) once it is gone."""
    anon = file = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "RssAnon":
                anon = int(value.split()[0])
            elif key in ("RssFile", "RssShmem"):
                file += int(value.split()[0])
    except OSError:
        pass
    return anon, file


def tree_rss_kb(root: int) -> tuple[int, int, int]:
    """(anonymous kB, file-backed kB, processes) summed over `root` and its descendants."""
    seen, todo = set(), [root]
    anon = file = 0
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        a, f = _rss_kb(pid)
        anon, file = anon + a, file + f
        todo += _children(pid)
    return anon, file, len(seen)


@dataclass
class MemoryPeak:
    anon_mb: float = 0.0  # the process tree's anonymous memory at its highest
    total_mb: float = 0.0  # anonymous + file-backed at its highest
    processes: int = 0  # most processes seen at once


class TreeSampler:
    """Samples `tree_rss_kb(os.getpid())` every `every_s` in a thread until stopped."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.every_s = every_s
        self.peak = MemoryPeak()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            anon, file, procs = tree_rss_kb(os.getpid())
            self.peak.anon_mb = max(self.peak.anon_mb, anon / 1024)
            self.peak.total_mb = max(self.peak.total_mb, (anon + file) / 1024)
            self.peak.processes = max(self.peak.processes, procs)
            self._stop.wait(self.every_s)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def weights_bytes(target: Path) -> int:
    """The target's safetensors bytes, as its fingerprint.json lists them."""
    files = json.loads((target / "fingerprint.json").read_text())["files"]
    return sum(size for name, (size, _) in files.items() if name.endswith(".safetensors"))


def _run_runner(
    target: Path, backend: str, options: dict, layer_ids: list[int] | None, dtype: str
) -> None:
    from specbuild.eagle.layers import default_layer_ids
    from specbuild.engines.model import ModelSpec
    from specbuild.engines.runtime import Runtime

    config = json.loads((target / "config.json").read_text())
    config = config.get("text_config", config)
    spec = ModelSpec(
        backend=backend,
        folder=str(target.resolve()),
        layer_ids=layer_ids or default_layer_ids(config["num_hidden_layers"]),
        dtype=dtype,
        device="cuda" if backend == "sglang" else "cpu",
        options=options,
    )
    engine = spec.load(Runtime())
    try:
        engine.extract([[(7 * i) % 1000 + 10 for i in range(512)] for _ in range(4)])
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()


def _run_server(target: Path, options: dict) -> None:
    from specbuild.engines.server import ServerOptions, SGLangServer

    spec = ServerOptions(server_args=options.get("server_args", {})).spec(target)
    with SGLangServer(spec, name="host-memory") as server:
        server.get_json("/get_model_info")


def measure(
    target: Path,
    engine: str,
    backend: str,
    options: dict,
    layer_ids: list[int] | None = None,
    dtype: str = "bfloat16",
) -> dict:
    with TreeSampler() as sampler:
        start = time.perf_counter()
        if engine == "server":
            _run_server(target, options)
        else:
            _run_runner(target, backend, options, layer_ids, dtype)
        wall_s = time.perf_counter() - start
    return {
        "target": target.name if target.name != "target" else target.parent.name,
        "engine": engine,
        "backend": "sglang" if engine == "server" else backend,
        "dtype": dtype,
        "weights_mb": round(weights_bytes(target) / 2**20, 1),
        **{k: round(v, 1) for k, v in asdict(sampler.peak).items()},
        "wall_s": round(wall_s, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path, help="a materialized target folder")
    parser.add_argument("--engine", choices=("runner", "server"), default="runner")
    parser.add_argument("--backend", choices=("sglang", "hf"), default="sglang")
    parser.add_argument("--options", default="{}", help="the engine's options as JSON")
    parser.add_argument("--dtype", default="bfloat16", help="the runner's compute dtype")
    parser.add_argument("--layer-ids", help="e.g. 1,3,4 (default: EAGLE-3's for the target)")
    parser.add_argument("--out", type=Path, help="append the row here (JSON lines)")
    args = parser.parse_args(argv)
    ids = [int(i) for i in args.layer_ids.split(",")] if args.layer_ids else None
    row = measure(args.target, args.engine, args.backend, json.loads(args.options), ids, args.dtype)
    print(json.dumps(row))
    if args.out:
        with args.out.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
