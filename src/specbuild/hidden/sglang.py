"""The `sglang` feature backend: hidden states computed by the serving engine itself.

Why two servers. SGLang 0.5.17 returns per prompt token, through `/generate` with
`return_hidden_states` and `max_new_tokens=1`:
  * with an EAGLE3 drafter loaded: the three aux states the drafter consumes, concatenated
    [T, 3H], at the layer ids of the drafter's `eagle_config` (what a served drafter sees);
  * with no drafter: the final post-norm state [T, H].
No single server returns both, so this backend starts two on the same GPU(s) for the shard:
an aux server with a *capture drafter* (random weights, the shard's layer ids; only the target's
states come back, so its weights never matter) and a plain server. In `parallel` mode both
serve at once: the aux server starts first with `mem_fraction_static` = f, the plain one once
the first holds its memory, with `second_mem_fraction(f)`. SGLang sizes its KV pool from the
free memory it sees against a fraction of the total (or, in newer versions, of the memory free
before its weights loaded), so two servers starting together both count the same free memory
and the later allocation fails; started in turn with 2f, the second gets about what the first
has under either accounting (f <= 0.4). In `sequential` mode (a target too large for two
copies, e.g. Kimi-K2.5 on 8 GPUs) one runs at a time with f, started anew for each `extract`
call, so the hidden stage should pass one batch per shard.

Cost (documented in the README): two server starts per hidden job, one after the other (on
SmolLM2/H200 ~40-90 s each), the target's weights twice in GPU memory (parallel mode), and
JSON transport of float lists (SGLang measured ~7.5k tok/s vs 300k tok/s prefill). Use large
shards with this backend (one job per shard) and keep `hf` for bulk extraction where the
engines agree (stage `align` measures whether they do).

Row integrity: the radix cache serves a repeated prefix from cache and returns no states for
it, and chunked prefill can split a prompt; both would silently drop rows. The servers run
with `--disable-radix-cache` and `--chunked-prefill-size -1`, and every sample's row count is
asserted against its input length anyway.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from specbuild.backends.openai import post_json, with_retries
from specbuild.backends.server import (
    DEFAULT_LAUNCHER,
    ServerSpec,
    SGLangServer,
    build_server_args,
)
from specbuild.io import read_json, write_json

__all__ = ["SGLangFeatureBackend", "write_capture_drafter", "parse_hidden_states", "RowCountError"]

log = logging.getLogger("specbuild")

AUX_LAYERS = 3
FEATURE_MODES = ("parallel", "sequential")
MAX_PARALLEL_FRACTION = 0.4  # the second server gets 2f: both plus activations must fit
# Flags the feature servers need for correct rows; a user value for these is overridden.
FEATURE_SERVER_ARGS = {
    "enable_return_hidden_states": True,
    "disable_radix_cache": True,
    "chunked_prefill_size": -1,
}
CAPTURE_DRAFT_VOCAB = 256  # the capture drafter never proposes anything we keep: keep it small


def second_mem_fraction(first: float) -> float:
    """mem_fraction_static of the server started second, beside one holding `first`.

    SGLang's KV budget is free memory minus (1 - f) x (total, or free-before-weights). With the
    first server holding f of the GPU, 2f gives the second (2f - f) = f of the total under the
    first accounting and 2f(1 - f) under the second: about the first server's share either way.
    """
    return round(min(2 * first, 0.85), 3)


class RowCountError(RuntimeError):
    """A server returned a different number of hidden-state rows than the sample has tokens."""


def write_capture_drafter(
    folder: str | os.PathLike,
    target_config: Mapping[str, Any],
    layer_ids: Sequence[int],
    *,
    seed: int = 0,
) -> Path:
    """Write a random-weight EAGLE-3 drafter folder whose only job is to make SGLang capture
    the target's aux states at `layer_ids`; config and tensors are those of stage export."""
    from specbuild.drafter.config import DrafterConfig
    from specbuild.export import expected_tensors, hf_config

    folder = Path(folder)
    target = dict(target_config.get("text_config", target_config))
    cfg = DrafterConfig.from_target(
        target, draft_vocab_size=min(CAPTURE_DRAFT_VOCAB, int(target["vocab_size"]))
    )
    config = hf_config(
        cfg, layer_ids=[int(i) for i in layer_ids], target_config=target, dtype="bfloat16"
    )
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, Tensor] = {}
    for name, (shape, _dtype) in expected_tensors(cfg, "bfloat16").items():
        if name == "d2t":
            tensors[name] = torch.zeros(shape, dtype=torch.int64)  # draft id i -> target id i
        elif name == "t2d":
            tensors[name] = torch.arange(shape[0]) < cfg.draft_vocab_size
        elif name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensors[name] = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", config)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def parse_hidden_states(
    response: Mapping[str, Any], *, n_tokens: int, width: int, what: str
) -> Tensor:
    """The prompt tokens' states [n_tokens, width] from one `/generate` output.

    meta_info.hidden_states holds one entry per forward step: the prefill's [T, D] first, then
    one [D] per decoded token (none with max_new_tokens=1). Anything but exactly n_tokens rows
    of width D is an error naming the sample: a silently short shard is what this guards.
    """
    meta = response.get("meta_info") or {}
    hs = meta.get("hidden_states")
    if not hs:
        raise RowCountError(
            f"{what}: no hidden_states in the response (is the server started "
            f"with --enable-return-hidden-states?); meta_info keys {sorted(meta)}"
        )
    first = hs[0]
    if first and not isinstance(first[0], list):
        first = [first]  # a one-token prompt may come back as one flat row
    rows = len(first)
    cached = meta.get("cached_tokens")
    if rows != n_tokens:
        raise RowCountError(
            f"{what}: server returned {rows} hidden-state rows for {n_tokens} input tokens "
            f"(cached_tokens={cached}); the radix cache or chunked prefill dropped rows. "
            f"Keep disable_radix_cache and chunked_prefill_size -1 for feature servers."
        )
    t = torch.tensor(first, dtype=torch.float32)  # shape: [T, D]
    if t.ndim != 2 or t.shape[1] != width:
        raise RowCountError(
            f"{what}: hidden states of shape {tuple(t.shape)}, expected "
            f"[{n_tokens}, {width}] (wrong layer ids or wrong server?)"
        )
    return t


class SGLangFeatureBackend:
    """FeatureBackend over two SGLang servers (aux with a capture drafter, plain for last)."""

    name = "sglang"

    def __init__(
        self,
        *,
        target_dir: str | os.PathLike,
        layer_ids: Sequence[int],
        launcher: Sequence[str] = DEFAULT_LAUNCHER,
        server_args: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 900.0,
        mem_fraction_static: float = 0.35,
        request_batch: int = 8,
        request_timeout_s: float = 600.0,
        mode: str = "parallel",
    ) -> None:
        if mode not in FEATURE_MODES:
            raise ValueError(f"sglang.hidden.mode {mode!r}: choose one of {FEATURE_MODES}")
        self.mode = mode
        self.target_dir = Path(target_dir)
        self.layer_ids = [int(i) for i in layer_ids]
        cfg = read_json(self.target_dir / "config.json")
        cfg = cfg.get("text_config", cfg)
        self.hidden = int(cfg["hidden_size"])
        self.request_batch = request_batch
        self.request_timeout_s = request_timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="specbuild-capture-drafter-")
        drafter = write_capture_drafter(Path(self._tmp.name) / "drafter", cfg, self.layer_ids)
        base = {
            **dict(server_args or {}),
            "mem_fraction_static": mem_fraction_static,
            **FEATURE_SERVER_ARGS,
        }
        aux_args = {
            **base,
            "speculative_algorithm": "EAGLE3",
            "speculative_draft_model_path": str(drafter),
            # the cheapest chain: the drafter's proposals are never used here
            "speculative_num_steps": 1,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 2,
        }

        def spec(args: Mapping[str, Any]) -> ServerSpec:
            return ServerSpec(
                model_path=str(self.target_dir),
                launcher=tuple(launcher),
                server_args=tuple(build_server_args(args)),
                env=dict(env or {}),
                host=host,
                startup_timeout_s=startup_timeout_s,
            )

        last_args = dict(base)
        if mode == "parallel":
            if mem_fraction_static > MAX_PARALLEL_FRACTION:
                raise ValueError(
                    f"sglang.hidden.mem_fraction_static {mem_fraction_static} is more than "
                    f"{MAX_PARALLEL_FRACTION}: two servers share the GPUs in parallel mode; "
                    f"lower it or use sglang.hidden.mode: sequential"
                )
            last_args["mem_fraction_static"] = second_mem_fraction(mem_fraction_static)
        self.servers = {
            "aux": SGLangServer(spec(aux_args), name="sglang-aux"),
            "last": SGLangServer(spec(last_args), name="sglang-last"),
        }
        if mode == "parallel":
            self._start("aux")
            self._start("last")  # only now: the aux server's memory is taken and counted

    def _start(self, which: str) -> None:
        """Start one server; on failure stop every server of this backend."""
        try:
            self.servers[which].start()
        except BaseException:
            self.close()
            raise
        if which == "aux":
            self._check_capture_layers()

    @classmethod
    def from_folder(
        cls,
        folder: str | os.PathLike,
        *,
        layer_ids: list[int],
        dtype: str,
        device: str,
        **options: Any,
    ) -> SGLangFeatureBackend:
        """The hidden stage's constructor; `dtype`/`device` belong to hf (SGLang serves the
        folder's own dtype on its GPUs). `options` are this class's keyword arguments."""
        return cls(target_dir=folder, layer_ids=layer_ids, **options)

    def _check_capture_layers(self) -> None:
        # SGLang takes the capture layers from the drafter's config; a version that ignored it
        # would still return [T, 3H], only from other layers. /server_info cannot show it, so
        # the width check in parse_hidden_states and stage `align` are the guards.
        info = self.servers["aux"].get_json("/server_info")
        algo = info.get("speculative_algorithm")
        if algo not in ("EAGLE3", None):
            raise RuntimeError(f"aux server runs speculative_algorithm={algo!r}, not EAGLE3")

    def _generate(self, which: str, batch: list[list[int]]) -> list[dict]:
        url = self.servers[which].base_url + "/generate"
        payload = {
            "input_ids": batch,
            "return_hidden_states": True,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        }
        out = with_retries(
            lambda: post_json(url, payload, timeout=self.request_timeout_s),
            what=f"{which} hidden states",
        )
        if len(out) != len(batch):
            raise RowCountError(f"{which} server returned {len(out)} outputs for {len(batch)}")
        return out

    def _states(self, which: str, batch: list[list[int]], width: int) -> list[Tensor]:
        out: list[Tensor] = []
        for start in range(0, len(batch), self.request_batch):
            chunk = batch[start : start + self.request_batch]
            for i, resp in enumerate(self._generate(which, chunk)):
                what = f"{which}, sample {start + i} of the batch ({len(chunk[i])} tokens)"
                out.append(
                    parse_hidden_states(resp, n_tokens=len(chunk[i]), width=width, what=what)
                )
        return out

    def extract(self, batch: list[list[int]]) -> list[tuple[Tensor, Tensor]]:
        widths = {"aux": AUX_LAYERS * self.hidden, "last": self.hidden}
        if self.mode == "parallel":
            with ThreadPoolExecutor(max_workers=2) as pool:
                futures = {k: pool.submit(self._states, k, batch, w) for k, w in widths.items()}
                states = {k: f.result() for k, f in futures.items()}
        else:
            # one server at a time: for targets too large for two copies; costs two server
            # starts per call, so give the hidden stage one batch per shard (batch_tokens)
            states = {}
            for k, w in widths.items():
                self._start(k)
                try:
                    states[k] = self._states(k, batch, w)
                finally:
                    self.servers[k].stop()
        return list(zip(states["aux"], states["last"], strict=True))

    def close(self) -> None:
        for srv in self.servers.values():
            srv.stop()
        self._tmp.cleanup()
