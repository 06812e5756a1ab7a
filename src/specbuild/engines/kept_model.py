"""One feature engine for every job of a run that opens the same one (`hidden.share_idle_s`):
the keeper kind `features` (engines.keepers).

Why: a hidden job loads its engine once per shard, and at Kimi-K2.5's size that load (~10
minutes) costs more than the shard. Here the first job starts a keeper that loads the engine
(`ModelSpec.load`, the job's own construction) and then runs requests: a whole shard for a
hidden job (the handler the registry's `kept_model.request` table names: the hidden stage's
own shard code, so a shard's bytes are the same either way), or one batch's features for
stage align (`KeptModel.extract`): where align's engine is the hidden jobs' own (the
Kimi-K2.5 example's SGLang runner over 8 GPUs), the recheck costs no second load. One engine
runs one request at a time, as one GPU does.

A job holds a lease, writes its request and waits:

    <registry>/features-<hash>/requests/<lease>.json   what to run, its inputs and outputs
                                        <lease>.done   the answer (JSON), or
                                        <lease>.error  why the request failed
                                        <lease>.log    the keeper's log lines of the request
                                        <lease>.safetensors  a batch's features (align)

An output the keeper writes for a job (a shard's part file) is the job's to publish, so only a
job that is still running publishes one; the keeper drops the output of a job that is gone.
The keeper writes (and removes) only what a request of a held lease may name: a batch's
features under requests/, a shard's part file of that lease directly inside the shard's folder,
named by a path without a link; any other output fails the request, and nothing is written. A
job whose keeper dies fails with the keeper's recorded cause and the last lines of keeper.log.
"""

from __future__ import annotations

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
from safetensors.torch import load_file

from specbuild.engines import keepers
from specbuild.engines.model import FeatureBackend, Features, ModelSpec
from specbuild.engines.registry import lazy_class
from specbuild.engines.runtime import Runtime
from specbuild.infra.io import atomic_path, read_json, write_json
from specbuild.infra.private_dirs import check_private_dir, private_dir
from specbuild.infra.safetensors_file import save_tensors

__all__ = ["KeptModel", "KeptModelError", "keep", "request_out"]

log = logging.getLogger("specbuild")


class KeptModelError(RuntimeError):
    """The kept feature engine failed a request, or stopped while a job waited on it."""


@contextmanager
def _lease(spec: ModelSpec, runtime: Runtime, name: str) -> Iterator[keepers.Lease]:
    with keepers.lease(
        spec.key(runtime),
        spec=spec.loaded_as(runtime),
        module="specbuild.engines.kept_model",
        idle_s=runtime.idle_s,
        name=name,
    ) as held:
        private_dir(held.folder / "requests")
        yield held


class KeptModel:
    """The kept engine of `spec` as a job sees it: a FeatureBackend whose `extract` has the
    keeper run the batch, and `ask` for any other request. Holds a lease from construction
    to `close`, so the engine stays loaded meanwhile."""

    def __init__(self, spec: ModelSpec, runtime: Runtime, *, name: str) -> None:
        self._stack = ExitStack()
        self._held = self._stack.enter_context(_lease(spec, runtime, name))
        # the engine's own name and ids once it has answered
        self.name = spec.backend
        self.eagle_layer_ids: list[int] = []
        self.device = torch.device("cpu")  # the features cross processes through the host
        self.dtype = spec.dtype
        self.threads = torch.get_num_threads()

    @property
    def tag(self) -> str:
        """This job's lease: unique to it, and what names its outputs beside the keeper's."""
        return self._held.tag

    def ask(self, request: dict[str, Any], *, what: str, item: str) -> dict[str, Any]:
        """Have the keeper run `request` (its `run` names the handler) and return its answer.
        `what` starts an error's message, `item` names what was asked for."""
        requests = self._held.folder / "requests"
        try:
            write_json(requests / f"{self.tag}.json", request)
            return _wait(self._held.folder, self.tag, what, item)
        finally:
            for suffix in ("json", "done", "error", "log"):
                (requests / f"{self.tag}.{suffix}").unlink(missing_ok=True)

    def extract(self, batch: list[list[int]]) -> Features:
        out = self._held.folder / "requests" / f"{self.tag}.safetensors"
        request = {"run": "batch", "batch": batch, "out": str(out), "threads": self.threads}
        try:
            answer = self.ask(
                request, what="align's sample", item=f"the batch of {len(batch)} rows"
            )
            tensors = load_file(out)
        finally:
            out.unlink(missing_ok=True)
        self.name, self.eagle_layer_ids = answer["engine"], answer["eagle_layer_ids"]
        return Features(aux=tensors["aux"], last=tensors["last"], lengths=tuple(answer["lengths"]))

    def close(self) -> None:
        self._stack.close()


def _replay(path: Path) -> None:
    """The keeper's log lines of this request, into the job's log."""
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
            raise KeptModelError(
                f"{what}: the shared feature engine ({folder}) failed {item}: {error.read_text()}"
            )
        if not running:
            failed = folder / "failed.txt"
            why = failed.read_text() if failed.is_file() else "no cause recorded (killed?)"
            raise KeptModelError(
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


def request_out(folder: Path, tag: str, request: dict[str, Any]) -> Path:
    """Where `request` (of lease `tag`, to the keeper of `folder`) may have the keeper write:
    a batch's features as requests/<tag>.safetensors; a shard as its part file
    `.<name>.<tag>.part`, directly inside the shard's folder, named by an absolute path with no
    link in it. Raises KeptModelError for any other path."""
    out = Path(str(request.get("out", "")))
    if request.get("run") == "batch":
        if out != folder / "requests" / f"{tag}.safetensors":
            raise KeptModelError(f"a batch's features go to requests/{tag}.safetensors, not {out}")
        return out
    if not out.is_absolute() or os.path.normpath(out) != str(out):
        raise KeptModelError(f"{out}: not an absolute path without '..' in it")
    if not (out.name.startswith(".") and out.name.endswith(f".{tag}.part")):
        raise KeptModelError(f"{out}: not the part file of this job's shard (.<name>.{tag}.part)")
    if out.parent.resolve() != out.parent or out.is_symlink():
        raise KeptModelError(f"{out}: reached through a symbolic link, which could lead anywhere")
    return out


def _serve(folder: Path, engine: FeatureBackend, spec: ModelSpec) -> None:
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
        try:
            out = request_out(folder, tag, request)
        except KeptModelError as err:  # refused before anything is written or removed
            log.error("request %s refused: %s", tag, err)
            keepers.write_text(requests / f"{tag}.error", f"refused: {err}")
            continue
        handler = logging.FileHandler(requests / f"{tag}.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
        try:
            if request["threads"]:
                torch.set_num_threads(request["threads"])
            if request["run"] == "batch":
                run = _run_batch
            else:
                run = lazy_class("kept_model.request", request["run"])
            answer = run(engine, spec, request, tag)
            if not keepers.lease_held(folder / "leases" / tag):
                out.unlink(missing_ok=True)  # nobody will read it
                log.info("request %s: its job is gone; its output dropped", tag)
                continue
            write_json(requests / f"{tag}.done", answer)
        except Exception as err:
            log.exception("request %s failed", tag)
            out.unlink(missing_ok=True)
            keepers.write_text(requests / f"{tag}.error", f"{type(err).__name__}: {err}")
        finally:
            log.removeHandler(handler)
            handler.close()


def _run_batch(
    engine: FeatureBackend, spec: ModelSpec, request: dict[str, Any], tag: str
) -> dict[str, Any]:
    """One batch's features (align's sample) as they come from the engine, in one file."""
    batch = request["batch"]
    log.info("request %s: a batch of %d rows (%d tokens)", tag, len(batch), sum(map(len, batch)))
    features = engine.extract(batch)
    tensors = {"aux": features.aux, "last": features.last}
    with atomic_path(request["out"]) as tmp:
        save_tensors({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp)
    return {
        "engine": engine.name,
        "eagle_layer_ids": list(engine.eagle_layer_ids),
        "lengths": list(features.lengths),
    }


def _exit_on_sigterm(signum: int, frame: object) -> None:
    sys.exit(128 + signum)


def keep(folder: Path, idle_s: float) -> int:
    """The keeper: load the engine of `folder`'s spec, then run requests until it is idle or
    asked to stop."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    check_private_dir(folder)  # its spec and requests say what runs, as this user
    fields = json.loads((folder / "spec.json").read_text())
    fields.pop("gpus", None)
    spec = ModelSpec(**fields)  # its options hold the memory share already (loaded_as)
    private_dir(folder / "requests")
    try:
        engine = spec.load(Runtime())
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
