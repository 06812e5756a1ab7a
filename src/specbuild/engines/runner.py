"""SGLang's model runner in this process: the serving engine's own forward, without a server.

The drafter must learn from the features the serving engine computes (docs/DESIGN.md's story: a
drafter trained on another engine's states accepted 25%). So `SGLangRunner` builds the very
`ModelRunner` an SGLang server builds (through `sglang.benchmark.one_batch.load_model`, the
same weights loader, kernels, attention backend and tensor-parallel layers), and runs prefill
batches on it directly: no server, no HTTP, no JSON, no capture drafter. The hidden stage's
feature adapter (hidden.sglang) turns its prefills into features.

    token-id batch -> Reqs -> ScheduleBatch -> ForwardBatch -> ModelRunner.forward
                         the decoder stack (model.model) returns (final post-norm [T, H],
                         [aux_low, aux_mid, aux_high] each [T, H]) for every token: one
                         forward hook takes both, packed in request order, on the GPU

Layer ids. The shards hold the outputs of `layer_ids` (HF `hidden_states[id + 1]`), which are
the *inputs* of SGLang's decoder layers id + 1. The eagle_config ids that make SGLang capture
those differ between its model families (specbuild.eagle.layers: DeepSeek-V2/V3 shift only
when the first id is 1); the runner sets them, reads the model's `layers_to_capture` back, and
records the ids that worked, which the shards keep and export writes into the drafter's
eagle_config, so serving captures the very layers the drafter trained on. A set nothing can
reach stops the job before any token runs. The aux states come back as a list of [T, H]
(Llama) or packed in one [T, 3H] (DeepSeek's AuxHiddenStatePacker); both are taken.

Tensor parallel. With `tp_size` N > 1 this process is rank 0 on the job's first pinned GPU and
starts ranks 1..N-1 (`python -m specbuild.engines.runner SPEC RANK`) on the next ones. Each
batch is broadcast from rank 0 over SGLang's own CPU group of the TP group, every rank runs the
same forward (the collectives need all of them), and only rank 0 keeps states: the residual
stream is all-reduced, so rank 0 holds the full [T, H] states.

Between batches the request and KV pools are cleared: nothing is cached, so every token's
states come from a full prefill of its own sample.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from specbuild.eagle.layers import candidate_eagle_ids, capture_indices, eagle_layer_ids
from specbuild.engines.gpus import startup_lock
from specbuild.engines.keepers import release_idle
from specbuild.engines.server import free_port, tp_size

__all__ = [
    "PrefillRunner",
    "SGLangRunner",
    "enable_aux_capture",
    "pack_aux",
    "plan_chunks",
    "runner_server_args",
    "stack_output",
    "worker_loop",
]

log = logging.getLogger("specbuild")

# ServerArgs every feature runner gets, whatever `sglang.server_args` says: prefill only, so no
# decode CUDA graphs (minutes of capture for nothing), and no prefix cache.
RUNNER_ARGS = {"disable_cuda_graph": True, "disable_radix_cache": True}
# Requests one forward may hold (SGLang's req_to_token_pool rows, context_length int32 each).
DEFAULT_MAX_REQUESTS = 1024
# Server-only flags a model runner has no use for; dropped so a server_args block shared with
# the serving bench does not trip ServerArgs' own checks here.
SERVER_ONLY_ARGS = ("host", "port", "api_key", "enable_return_hidden_states")


def runner_server_args(
    model_path: str | os.PathLike,
    server_args: Mapping[str, Any],
    *,
    mem_fraction_static: float,
) -> dict[str, Any]:
    """The ServerArgs keywords of a feature runner: the user's flags as keyword names, the
    hidden stage's memory share, and RUNNER_ARGS on top."""
    args = {k: v for k, v in server_args.items() if k not in SERVER_ONLY_ARGS}
    if "tp" in args or "tp_size" in args:  # ServerArgs knows tp_size, not the CLI alias tp
        args["tp_size"] = tp_size(args)
        args.pop("tp", None)
    args.setdefault("max_running_requests", DEFAULT_MAX_REQUESTS)
    return {
        **args,
        "model_path": str(model_path),
        "mem_fraction_static": mem_fraction_static,
        **RUNNER_ARGS,
    }


def plan_chunks(lengths: Sequence[int], *, max_tokens: int, max_requests: int) -> list[range]:
    """Consecutive runs of the batch that fit one forward (tokens and requests), in order."""
    chunks: list[range] = []
    start, tokens = 0, 0
    for j, n in enumerate(lengths):
        if n > max_tokens:
            raise ValueError(
                f"sample {j} of the batch has {n} tokens, more than the {max_tokens} the "
                f"runner's KV pool holds; raise sglang.hidden.mem_fraction_static or lower "
                f"tokenize.max_length"
            )
        if j > start and (tokens + n > max_tokens or j - start >= max_requests):
            chunks.append(range(start, j))
            start, tokens = j, 0
        tokens += n
    if start < len(lengths):
        chunks.append(range(start, len(lengths)))
    return chunks


def enable_aux_capture(
    model: torch.nn.Module, layer_ids: Sequence[int], num_layers: int
) -> tuple[torch.nn.Module, list[int]]:
    """Turn SGLang's EAGLE-3 aux capture on so that it captures the outputs of `layer_ids`;
    return the decoder stack that captures (its forward returns (final post-norm, aux)) and
    the eagle_config ids that did it (specbuild.eagle.layers). The model's own
    `layers_to_capture` decides: specbuild's reading of SGLang's rule comes first, the other
    convention second, and anything else is refused."""
    if not hasattr(model, "set_eagle3_layers_to_capture"):
        raise RuntimeError(
            f"SGLang's {type(model).__name__} has no EAGLE-3 aux capture "
            f"(set_eagle3_layers_to_capture): SGLang cannot serve an EAGLE-3 drafter for this "
            f"target either"
        )
    arch = type(model).__name__
    want = capture_indices(layer_ids)
    try:
        first = eagle_layer_ids(arch, layer_ids, num_layers)
    except ValueError as err:
        raise RuntimeError(str(err)) from err
    tried = []
    for eagle_ids in (first, *[c for c in candidate_eagle_ids(layer_ids) if c != first]):
        model.set_eagle3_layers_to_capture(list(eagle_ids))
        stacks = [m for m in model.modules() if getattr(m, "layers_to_capture", None)]
        got = [list(m.layers_to_capture) for m in stacks]
        if got == [want]:
            if eagle_ids != first:
                log.warning(
                    "SGLang's %s captured %s for eagle ids %s, not for %s as specbuild reads "
                    "its rule: the shards and the exported eagle_config use %s",
                    arch,
                    want,
                    eagle_ids,
                    first,
                    eagle_ids,
                )
            return stacks[0], list(eagle_ids)
        tried.append(f"{eagle_ids} -> {got}")
    raise RuntimeError(
        f"SGLang's {arch} captures no decoder stack with {want} (the inputs of layers id + 1, "
        f"the outputs of layer ids {list(layer_ids)}) for any eagle ids ({'; '.join(tried)}): a "
        f"served drafter would see other layers than the shards, so this stops here."
    )


def pack_aux(aux: Tensor | Sequence[Tensor] | None) -> Tensor | None:
    """[T, 3H] from what SGLang's decoder stack hands back: a list of [T, H] (Llama, Qwen,
    ...), one tensor already packed (models on AuxHiddenStatePacker: DeepSeek-V2/V3), or
    nothing captured."""
    if aux is None:
        return None
    if isinstance(aux, Tensor):
        return aux if aux.numel() else None
    return torch.cat(list(aux), dim=-1) if len(aux) else None


def stack_output(out: Tensor | tuple) -> tuple[Tensor, Tensor | None]:
    """(final post-norm [T, H], aux [T, 3H] or None) from a decoder stack's forward output:
    a tuple while capturing, the bare final state otherwise."""
    if isinstance(out, tuple):
        return out[0], pack_aux(out[1])
    return out, None


def worker_loop(
    receive: Callable[[], list[list[int]] | None], run: Callable[[list[list[int]]], object]
) -> int:
    """A TP rank > 0: run every batch rank 0 sends until it sends None; the batches run."""
    n = 0
    while (batch := receive()) is not None:
        run(batch)
        n += 1
    return n


class PrefillRunner(Protocol):
    """One model runner: a prefill of a batch of token-id lists returns (last [T, H],
    aux [T, 3H]) packed in request order on `device` (aux None when `capture` is off)."""

    device: torch.device
    dtype: str
    hidden_size: int
    vocab_size: int
    max_tokens: int
    max_requests: int
    eagle_layer_ids: list[int]  # the eagle_config ids that captured the shards' layers

    def prefill(
        self, batch: list[list[int]], *, capture: bool = True
    ) -> tuple[Tensor, Tensor | None]: ...

    def close(self) -> None: ...


def _requests(batch: list[list[int]]) -> list[Any]:
    """SGLang Reqs for a prefill of `batch` (no prefix, greedy, one new token)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_new_tokens=1)
    reqs = []
    for i, ids in enumerate(batch):
        req = Req(
            rid=str(i),
            origin_input_text="",
            origin_input_ids=array("q", ids),
            sampling_params=params,
        )
        req.full_untruncated_fill_ids = req.origin_input_ids
        req.logprob_start_len = -1
        req.set_extend_range(0, len(ids))
        reqs.append(req)
    return reqs


def _load(spec: Mapping[str, Any], rank: int) -> Any:
    """ModelRunner of `rank`, as SGLang's one-batch benchmark (and its servers) build one."""
    import dataclasses

    from sglang.benchmark.one_batch import load_model
    from sglang.srt.server_args import PortArgs, ServerArgs

    server_args = ServerArgs(**spec["server_args"])
    try:  # environment SGLang's own launchers set (NCCL, CUDA connections); private in 0.5.17
        from sglang.srt.entrypoints.engine import _set_envs_and_config

        _set_envs_and_config(server_args)
    except ImportError:
        pass
    port_args = dataclasses.replace(PortArgs.init_new(server_args), nccl_port=spec["nccl_port"])
    runner, _tokenizer = load_model(server_args, port_args, rank, rank)
    return runner


def _leave_groups() -> None:
    """Destroy SGLang's TP groups and torch's default group: without it torch warns at every
    exit of a process that held a runner, and NCCL's resources wait on the exit to go."""
    try:
        from sglang.srt.distributed.parallel_state import (
            destroy_distributed_environment,
            destroy_model_parallel,
        )

        destroy_model_parallel()
        destroy_distributed_environment()
    except Exception as err:  # the runner's work is done: a failed teardown only warns
        log.warning("leaving SGLang's process groups: %s", err)


def _broadcast(batch: list[list[int]] | None) -> list[list[int]] | None:
    """Rank 0's batch (or None: stop) to every TP rank over SGLang's CPU (gloo) group."""
    import torch.distributed as dist
    from sglang.srt.distributed.parallel_state import get_tp_group

    box = [batch]
    dist.broadcast_object_list(box, src=0, group=get_tp_group().cpu_group)
    return box[0]


class SGLangRunner:
    """PrefillRunner over SGLang's ModelRunner (rank 0 here, ranks 1..tp-1 as subprocesses)."""

    def __init__(
        self,
        target_dir: str | os.PathLike,
        *,
        layer_ids: Sequence[int],
        server_args: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        mem_fraction_static: float = 0.5,
        **_server_options: Any,  # launcher, host, timeouts: server settings, unused in-process
    ) -> None:
        try:
            import sglang  # noqa: F401
        except ImportError as err:
            raise RuntimeError(
                f"hidden.backend sglang runs SGLang inside the job, and this Python "
                f"({sys.executable}) cannot import it ({err}): install sglang (envs/, "
                f"docs/sglang.md) or use hidden.backend hf"
            ) from err
        self.layer_ids = [int(i) for i in layer_ids]
        args = runner_server_args(
            target_dir, server_args or {}, mem_fraction_static=mem_fraction_static
        )
        self.tp_size = int(args.get("tp_size", 1))
        visible = torch.cuda.device_count()
        if self.tp_size > visible:
            raise RuntimeError(
                f"sglang.server_args.tp_size {self.tp_size}: this job sees {visible} GPU(s) "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
            )
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        spec = {"server_args": args, "nccl_port": free_port()}
        self._tmp = tempfile.TemporaryDirectory(prefix="specbuild-sglang-ranks-")
        self.workers: list[subprocess.Popen] = []
        self._closed = False
        release_idle()  # a kept engine left idle on these GPUs: its memory is ours
        # one start at a time per GPU: the KV pool is sized from the memory free at start
        with startup_lock("SGLang model runner"):
            if self.tp_size > 1:
                self._start_workers(spec)
            try:
                self.runner = _load(spec, 0)
            except BaseException:
                self._stop_workers()
                raise
        mr = self.runner.torch_runner
        self.device = (
            torch.device(mr.device, mr.gpu_id) if mr.device == "cuda" else torch.device(mr.device)
        )
        self.dtype = str(mr.model_config.dtype).removeprefix("torch.")
        cfg = mr.model_config.hf_text_config
        self.hidden_size = int(cfg.hidden_size)
        self.vocab_size = int(mr.model_config.vocab_size)
        self.max_tokens = int(mr.max_total_num_tokens)
        self.max_requests = int(mr.req_to_token_pool.size)
        self.model = mr.model
        self._stack, self.eagle_layer_ids = enable_aux_capture(
            self.model, self.layer_ids, int(cfg.num_hidden_layers)
        )
        self._out: list[Any] = []
        self._stack.register_forward_hook(lambda _m, _i, out: self._out.append(out))
        # host seconds per part of a prefill (SGLang's step launches the forward and syncs
        # inside; its Python, not the GPU, can bound a small target: BENCHMARKS.md)
        self.host_s = {"requests": 0.0, "step": 0.0, "clear": 0.0}
        self.batches = 0
        log.info(
            "SGLang model runner: %s, tp %d, %d KV tokens, %d requests a forward, capture "
            "inputs of layers %s",
            type(self.model).__name__,
            self.tp_size,
            self.max_tokens,
            self.max_requests,
            capture_indices(self.layer_ids),
        )

    def _capture(self, on: bool) -> None:
        # the flag lives on the causal LM, which a wrapper (Kimi-K2.5's) holds inside it
        for m in self.model.modules():
            if hasattr(m, "capture_aux_hidden_states"):
                m.capture_aux_hidden_states = on
        self._stack.layers_to_capture = capture_indices(self.layer_ids) if on else []

    def _start_workers(self, spec: Mapping[str, Any]) -> None:
        path = Path(self._tmp.name) / "spec.json"
        path.write_text(json.dumps(spec))
        for rank in range(1, self.tp_size):
            cmd = [sys.executable, "-m", "specbuild.engines.runner", str(path), str(rank)]
            self.workers.append(subprocess.Popen(cmd))
        # a rank that dies leaves the others blocked in a collective: end the job instead
        threading.Thread(target=self._watch_workers, daemon=True).start()

    def _watch_workers(self) -> None:
        while not self._closed:
            for rank, proc in enumerate(self.workers, 1):
                code = proc.poll()
                if code is not None and not self._closed:
                    log.error("SGLang TP rank %d exited with code %s: stopping the job", rank, code)
                    self._stop_workers()
                    os._exit(1)
            threading.Event().wait(1.0)

    def _stop_workers(self) -> None:
        self._closed = True
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
        for proc in self.workers:
            proc.wait()

    @torch.inference_mode()
    def prefill(
        self, batch: list[list[int]], *, capture: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        from sglang.benchmark.one_batch import extend

        if self.tp_size > 1:
            _broadcast(batch)
        self._capture(capture)
        self._out.clear()
        t0 = time.perf_counter()
        reqs = _requests(batch)
        t1 = time.perf_counter()
        try:
            extend(reqs, self.runner.torch_runner)
        finally:
            t2 = time.perf_counter()
            self.runner.clear()  # request and KV pools: nothing carries over between batches
            t3 = time.perf_counter()
            for key, seconds in zip(self.host_s, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                self.host_s[key] += seconds
            self.batches += 1
        (out,) = self._out
        return stack_output(out)

    def close(self) -> None:
        if self._closed:
            return
        log.info(
            "SGLang model runner: %d prefills; host seconds building requests %.2f, in SGLang's "
            "step %.2f, clearing pools %.2f",
            self.batches,
            *self.host_s.values(),
        )
        self._closed = True  # from here on a rank exiting is expected, not a failure
        if self.tp_size > 1:
            try:
                _broadcast(None)
                _leave_groups()  # every rank at once, as each leaves its loop
                for proc in self.workers:
                    proc.wait(timeout=60)
            except Exception as err:  # a rank already gone: stop the rest below
                log.warning("stopping SGLang TP ranks: %s", err)
        else:
            _leave_groups()
        self._stop_workers()
        self._tmp.cleanup()


def serve_rank(spec_path: str | os.PathLike, rank: int) -> None:
    """A TP rank > 0: load the same runner, then run every batch rank 0 broadcasts."""
    from sglang.benchmark.one_batch import extend

    spec = json.loads(Path(spec_path).read_text())
    runner = _load(spec, rank)

    def run(batch: list[list[int]]) -> None:
        # no capture here: it adds no collective, and rank 0 alone keeps the states
        try:
            extend(_requests(batch), runner.torch_runner)
        finally:
            runner.clear()

    with torch.inference_mode():
        n = worker_loop(lambda: _broadcast(None), run)
    log.info("SGLang TP rank %d: %d batches", rank, n)
    _leave_groups()


if __name__ == "__main__":
    serve_rank(sys.argv[1], int(sys.argv[2]))
