"""One feature engine for every `hidden` job of a run that opens the same one
(`hidden.share_idle_s`): the keeper kind `features` (specbuild.keepers).

Why: a hidden job opens its backend once per shard, and at Kimi-K2.5's size that load (~10
minutes) costs more than the shard. Here the first job starts a keeper that opens the engine
(`EngineSpec.open`, the job's own construction) and then runs whole shards on request with
`extract_with`, the code of the unshared path, so a shard's bytes are the same either way.
One engine runs one shard at a time, as one GPU does.

A job holds a lease, writes its request and waits:

    <registry>/features-<hash>/requests/<lease>.json   inputs, the part file, the params
                                        <lease>.done   its ExtractStats (JSON), or
                                        <lease>.error  why the shard failed
                                        <lease>.log    the keeper's log lines of the shard

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
from pathlib import Path

import torch

from specbuild import keepers
from specbuild.hidden.extract import (
    EngineSpec,
    ExtractStats,
    FeatureBackend,
    extract_with,
    read_shard_inputs,
)
from specbuild.io import read_json, write_json

__all__ = ["SharedEngineError", "engine_key", "extract_shared", "keep"]

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
    with keepers.lease(
        engine_key(spec, target_fingerprint),
        spec=dataclasses.asdict(spec),
        module="specbuild.hidden.shared",
        idle_s=idle_s,
        name="hidden",
    ) as held:
        requests = held.folder / "requests"
        requests.mkdir(exist_ok=True)
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
            write_json(requests / f"{held.tag}.json", request)
            stats = _wait(held.folder, held.tag, tokens)
            os.replace(part, out)
        finally:
            part.unlink(missing_ok=True)
            # the keeper's temp file of the part, where it died writing it (io.atomic_path)
            for tmp in part.parent.glob(f".{part.name}.*.tmp"):
                tmp.unlink(missing_ok=True)
            for suffix in ("json", "done", "error", "log"):
                (requests / f"{held.tag}.{suffix}").unlink(missing_ok=True)
    return dataclasses.replace(stats, file_bytes=os.path.getsize(out))


def _replay(path: Path) -> None:
    """The keeper's log lines of this shard, into the job's log."""
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            log.info("keeper: %s", line)


def _wait(folder: Path, tag: str, tokens: str | os.PathLike) -> ExtractStats:
    requests = folder / "requests"
    done, error = requests / f"{tag}.done", requests / f"{tag}.error"
    while True:
        running = keepers.keeper_running(folder)
        # read after the liveness check: a keeper that wrote its answer and then died answered
        if done.is_file():
            _replay(requests / f"{tag}.log")
            return ExtractStats(**read_json(done))
        if error.is_file():
            _replay(requests / f"{tag}.log")
            raise SharedEngineError(
                f"{tokens}: the shared feature engine ({folder}) failed the shard: "
                f"{error.read_text()}"
            )
        if not running:
            failed = folder / "failed.txt"
            why = failed.read_text() if failed.is_file() else "no cause recorded (killed?)"
            raise SharedEngineError(
                f"{tokens}: the shared feature engine stopped before the shard was done: "
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
            log.info("request %s: %s -> %s", tag, request["tokens"], part)
            if request["threads"]:
                torch.set_num_threads(request["threads"])
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
            if not keepers.lease_held(folder / "leases" / tag):
                part.unlink(missing_ok=True)  # nobody will publish it
                log.info("request %s: its job is gone; its shard dropped", tag)
                continue
            write_json(requests / f"{tag}.done", dataclasses.asdict(stats))
        except Exception as err:
            log.exception("request %s failed", tag)
            part.unlink(missing_ok=True)
            keepers.write_text(requests / f"{tag}.error", f"{type(err).__name__}: {err}")
        finally:
            log.removeHandler(handler)
            handler.close()


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
