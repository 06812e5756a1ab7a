"""One feature engine for every `hidden` job of a run that opens the same one
(`hidden.share_idle_s`): the keeper kind `features` (specbuild.engines.keepers).

Why: a hidden job opens its backend once per shard, and at Kimi-K2.5's size that load (~10
minutes) costs more than the shard. Here the first job starts a keeper that opens the engine
(`EngineSpec.open`, the job's own construction) and then runs whole shards on request with
`extract_with`, the code of the unshared path, so a shard's bytes are the same either way.
One engine runs one shard at a time, as one GPU does. Stage align asks the same keeper for
the features of its sample (`open_engine`): where its engine is the hidden jobs' own (the
Kimi-K2.5 example's SGLang runner over 8 GPUs), the recheck costs no second load.

A job holds a lease, writes its request and waits:

    <registry>/features-<hash>/requests/<lease>.json   inputs, the part file, the params
                                        <lease>.done   its ExtractStats (JSON), or
                                        <lease>.error  why the shard failed
                                        <lease>.log    the keeper's log lines of the shard
                                        <lease>.safetensors  a batch's features (align)

The keeper writes the shard to `.<name>.<lease>.part` beside the output and the job renames it
into place, so only a job that is still running publishes a shard: a killed job leaves
nothing that looks finished, and the keeper drops a part whose job is gone. A job whose keeper
dies fails with the keeper's recorded cause and the last lines of keeper.log.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from specbuild.engines import keepers
from specbuild.hidden.extract import (
    EngineSpec,
    ExtractStats,
    FeatureBackend,
    Features,
    extract_with,
    read_shard_inputs,
)
from specbuild.io import atomic_path, read_json, write_json

__all__ = [
    "SharedEngineError",
    "SharedFeatureEngine",
    "engine_key",
    "extract_shared",
    "keep",
    "open_engine",
]

log = logging.getLogger("specbuild")

KIND = "features"


class SharedEngineError(RuntimeError):
    """The shared feature engine failed a shard, or stopped while a job waited on it."""


def engine_key(spec: EngineSpec, target_fingerprint: str) -> str:
    """What makes two jobs' engines the same one: everything the loaded model depends on (the
    keepers add the GPUs); storage, batch size and threads are per shard."""
    return keepers.keeper_key(
        KIND, {**dataclasses.asdict(spec), "target_fingerprint": target_fingerprint}
    )


def extract_shared(
    spec: EngineSpec,
    *,
    tokens: str | os.PathLike,
    meta: str | os.PathLike,
    fingerprint: str | os.PathLike,
    out: str | os.PathLike,
    layer_ids: list[int] | None,
    storage: str,
    batch_tokens: int,
    threads: int | None,
    idle_s: float,
    target_fingerprint: str,
) -> ExtractStats:
    """Have the shared engine of `spec` extract the shard `tokens` into `out`, starting its
    keeper if none runs (kept `idle_s` after its last job)."""
    out = Path(out)
    with _lease(spec, target_fingerprint, idle_s, "hidden") as held:
        part = out.parent / f".{out.name}.{held.tag}.part"
        request = {
            "tokens": str(Path(tokens).resolve()),
            "meta": str(Path(meta).resolve()),
            "fingerprint": str(Path(fingerprint).resolve()),
            "out": str(part.resolve()),
            "layer_ids": list(layer_ids or []),
            "storage": storage,
            "batch_tokens": batch_tokens,
            "threads": threads,
        }
        try:
            stats = ExtractStats(**_ask(held, request, str(tokens), "the shard"))
            os.replace(part, out)
        finally:
            part.unlink(missing_ok=True)
            # the keeper's temp file of the part, where it died writing it (io.atomic_path)
            for tmp in part.parent.glob(f".{part.name}.*.tmp"):
                tmp.unlink(missing_ok=True)
    return dataclasses.replace(stats, file_bytes=os.path.getsize(out))


@contextmanager
def _lease(
    spec: EngineSpec, target_fingerprint: str, idle_s: float, name: str
) -> Iterator[keepers.Lease]:
    with keepers.lease(
        engine_key(spec, target_fingerprint),
        spec=dataclasses.asdict(spec),
        module="specbuild.hidden.shared",
        idle_s=idle_s,
        name=name,
    ) as held:
        (held.folder / "requests").mkdir(exist_ok=True)
        yield held


def _ask(held: keepers.Lease, request: dict[str, Any], what: str, item: str) -> dict[str, Any]:
    """Write the request of this lease, wait for the keeper's answer, and clear both. `what`
    starts an error's message, `item` names what was asked for."""
    requests = held.folder / "requests"
    try:
        write_json(requests / f"{held.tag}.json", request)
        return _wait(held.folder, held.tag, what, item)
    finally:
        for suffix in ("json", "done", "error", "log"):
            (requests / f"{held.tag}.{suffix}").unlink(missing_ok=True)


class SharedFeatureEngine:
    """A FeatureBackend whose engine is the keeper's: `extract` has the keeper run the batch.
    Holds a lease from construction to `close`, so the engine stays loaded meanwhile."""

    def __init__(
        self, spec: EngineSpec, *, idle_s: float, target_fingerprint: str, name: str
    ) -> None:
        self._stack = ExitStack()
        self._held = self._stack.enter_context(_lease(spec, target_fingerprint, idle_s, name))
        # the engine's own name and ids once it has answered
        self.name = spec.backend
        self.eagle_layer_ids: list[int] = []
        self.device = torch.device("cpu")  # the features cross processes through the host
        self.dtype = spec.dtype
        self.threads = torch.get_num_threads()

    def extract(self, batch: list[list[int]]) -> Features:
        out = self._held.folder / "requests" / f"{self._held.tag}.safetensors"
        request = {"batch": batch, "out": str(out), "threads": self.threads}
        try:
            answer = _ask(self._held, request, "align's sample", f"the batch of {len(batch)} rows")
            tensors = load_file(out)
        finally:
            out.unlink(missing_ok=True)
        self.name, self.eagle_layer_ids = answer["engine"], answer["eagle_layer_ids"]
        return Features(aux=tensors["aux"], last=tensors["last"], lengths=tuple(answer["lengths"]))

    def close(self) -> None:
        self._stack.close()


def open_engine(
    spec: EngineSpec, *, idle_s: float, target_fingerprint: str, name: str
) -> FeatureBackend | SharedFeatureEngine:
    """The engine of `spec` for the job `name`: the run's shared one when jobs share
    (`keepers.sharing_allowed`), started if none runs, else the job's own."""
    if keepers.sharing_allowed(idle_s):
        return SharedFeatureEngine(
            spec, idle_s=idle_s, target_fingerprint=target_fingerprint, name=name
        )
    return spec.open()


def _replay(path: Path) -> None:
    """The keeper's log lines of this shard, into the job's log."""
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            log.info("keeper: %s", line)


def _wait(folder: Path, tag: str, what: str, item: str) -> dict[str, Any]:
    requests = folder / "requests"
    done, error = requests / f"{tag}.done", requests / f"{tag}.error"
    while True:
        running = keepers.keeper_running(folder)
        # read after the liveness check: a keeper that wrote its answer and then died answered
        if done.is_file():
            _replay(requests / f"{tag}.log")
            return read_json(done)
        if error.is_file():
            _replay(requests / f"{tag}.log")
            raise SharedEngineError(
                f"{what}: the shared feature engine ({folder}) failed {item}: {error.read_text()}"
            )
        if not running:
            failed = folder / "failed.txt"
            why = failed.read_text() if failed.is_file() else "no cause recorded (killed?)"
            raise SharedEngineError(
                f"{what}: the shared feature engine stopped before {item} was done: "
                f"{why}\nthe last lines of {folder / keepers.KEEPER_LOG}:\n"
                f"{keepers.log_tail(folder)}"
            )
        time.sleep(keepers.POLL_S / 5)


def _arrival(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # its job gave up since the listing; skipped below
        return 0.0


def _serve(folder: Path, engine: FeatureBackend, spec: EngineSpec) -> None:
    """Run every waiting request, oldest first."""
    requests = folder / "requests"
    for path in sorted(requests.glob("*.json"), key=_arrival):
        tag = path.stem
        try:
            request = read_json(path)
            path.unlink()
        except FileNotFoundError:  # its job gave up meanwhile
            continue
        if not keepers.lease_held(folder / "leases" / tag):
            log.info("request %s: its job is gone; skipped", tag)
            continue
        handler = logging.FileHandler(requests / f"{tag}.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
        part = Path(request["out"])
        try:
            if request["threads"]:
                torch.set_num_threads(request["threads"])
            run = _run_batch if "batch" in request else _run_shard
            answer = run(engine, spec, request, tag)
            if not keepers.lease_held(folder / "leases" / tag):
                part.unlink(missing_ok=True)  # nobody will read it
                log.info("request %s: its job is gone; its output dropped", tag)
                continue
            write_json(requests / f"{tag}.done", answer)
        except Exception as err:
            log.exception("request %s failed", tag)
            part.unlink(missing_ok=True)
            keepers.write_text(requests / f"{tag}.error", f"{type(err).__name__}: {err}")
        finally:
            log.removeHandler(handler)
            handler.close()


def _run_shard(
    engine: FeatureBackend, spec: EngineSpec, request: dict[str, Any], tag: str
) -> dict[str, Any]:
    """A hidden job's shard, written to its part file; its ExtractStats."""
    part = Path(request["out"])
    log.info("request %s: %s -> %s", tag, request["tokens"], part)
    inputs = read_shard_inputs(
        tokens=request["tokens"],
        meta=request["meta"],
        fingerprint=request["fingerprint"],
        out=part,
        layer_ids=request["layer_ids"],
        storage=request["storage"],
    )
    if inputs.layer_ids != spec.layer_ids:  # the key holds them: a fault of ours
        raise SharedEngineError(f"layer ids {inputs.layer_ids}, engine {spec.layer_ids}")
    stats = extract_with(engine, inputs, out=part, batch_tokens=request["batch_tokens"])
    return dataclasses.asdict(stats)


def _run_batch(
    engine: FeatureBackend, spec: EngineSpec, request: dict[str, Any], tag: str
) -> dict[str, Any]:
    """One batch's features (align's sample) as they come from the engine, in one file."""
    batch = request["batch"]
    log.info("request %s: a batch of %d rows (%d tokens)", tag, len(batch), sum(map(len, batch)))
    features = engine.extract(batch)
    tensors = {"aux": features.aux, "last": features.last}
    with atomic_path(request["out"]) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp))
    return {
        "engine": engine.name,
        "eagle_layer_ids": list(engine.eagle_layer_ids),
        "lengths": list(features.lengths),
    }


def _exit_on_sigterm(signum: int, frame: object) -> None:
    sys.exit(128 + signum)


def keep(folder: Path, idle_s: float) -> int:
    """The keeper: open the engine of `folder`'s spec, then run shards until it is idle or
    asked to stop."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    fields = json.loads((folder / "spec.json").read_text())
    fields.pop("gpus", None)
    spec = EngineSpec(**fields)
    (folder / "requests").mkdir(exist_ok=True)
    try:
        engine = spec.open()
    except Exception as err:
        log.exception("the feature engine did not open")
        keepers.fail(folder, f"the feature engine did not open: {type(err).__name__}: {err}")
        return 1
    except SystemExit:
        keepers.fail(folder, "the feature engine's keeper was stopped by a signal")
        return 1

    def close() -> None:
        closing = getattr(engine, "close", None)
        if closing is not None:
            closing()

    try:
        keepers.serve_until_idle(
            folder, idle_s, tick=lambda: _serve(folder, engine, spec), stop=close
        )
        return 0
    except SystemExit:
        keepers.fail(folder, "the feature engine's keeper was stopped by a signal")
    except Exception as err:
        log.exception("the feature engine's keeper failed")
        keepers.fail(folder, f"the feature engine's keeper failed: {type(err).__name__}: {err}")
    close()
    return 1


if __name__ == "__main__":
    sys.exit(keep(Path(sys.argv[1]), float(sys.argv[2])))
