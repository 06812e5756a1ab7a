"""The PyTorch bench engine: lossless EAGLE-3 chain speculation over an HF target, and its baseline.

The drafter comes from an exported folder (config.json + model.safetensors), loaded the way
SGLang loads it: the aux layer ids from `eagle_config`, the embedding borrowed from the target.
Output is token-for-token the target's greedy decode; only the number of target forwards changes.

Alignment (x = committed tokens, g_i = target aux states at position i, D = drafter forward):

    target cache  x0 x1 ... x_{b-1}            | last = x_b (committed, not yet in the cache)
    drafter cache (x1,g0) ... (x_b,g_{b-1})     | drafter position i pairs token x_{i+1} with g_i
    draft         D(x_b, g_{b-1}) -> d1, then D(d_k, h_k) -> d_{k+1} with h_k its own output
    verify        target([x_b, d1..dS]) -> p0..pS; accept d1..dn while d_k == p_{k-1}; bonus p_n
    rollback      target cache -> b + n + 1 entries; drafter cache -> b entries, then extend it
                  with (d1,g_b) ... (p_n, g_{b+n}) from the verify pass's own aux states
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from specbuild.bench.rows import Completion, device_label
from specbuild.block_export import family_of
from specbuild.eagle.chain import BASELINE, NO_DRAFTER, Chain
from specbuild.infra.io import read_json

log = logging.getLogger("specbuild")

__all__ = [
    "HFBaseline",
    "HFBlockDecoder",
    "HFSpecDecoder",
    "load_block",
    "open_hf",
    "load_drafter",
    "eos_token_ids",
    "crop_cache",
    "cache_kwarg",
    "cached_forward",
]


def eos_token_ids(model, tokenizer) -> set[int]:
    """Every id that ends a turn: the generation config's and the tokenizer's."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for value in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    if not ids:
        raise ValueError("the target has no EOS token id (generation_config or tokenizer)")
    return ids


def load_drafter(
    folder: str | os.PathLike, target, target_config: dict | None = None
) -> tuple[torch.nn.Module, list[int]]:
    """An EAGLE-3 drafter folder SGLang loads (ours or another trainer's) in float32 eval
    mode, plus the target layer-output ids SGLang feeds it: its `eagle_config`'s through
    SGLang's rule for the target (specbuild.eagle.layers), or without one SGLang's defaults.

    Checks the folder against the target first and raises once with every mismatch.
    """
    from specbuild.drafter.model import Eagle3Drafter
    from specbuild.eagle.drafter_fit import FOREIGN_ADVICE, fit_faults

    folder = Path(folder)
    # the target folder's own config.json where known: a wrapper's architecture (Kimi-K2.5's)
    # decides SGLang's layer rule, and the text model built from text_config does not carry it
    config = target_config if target_config is not None else target.config.to_dict()
    faults, layer_ids = fit_faults(read_json(folder / "config.json"), config)
    if faults:
        raise ValueError(
            f"{folder}/config.json does not fit the target:\n  "
            + "\n  ".join(faults)
            + "\nOur variant's export (results/drafter/<variant>): rebuild it for this target "
            f"(snakemake --forcerun train). A bench.drafters folder: {FOREIGN_ADVICE}."
        )
    log.info("%s: SGLang feeds it the target's layer outputs %s", folder, layer_ids)
    embed = target.get_input_embeddings().weight.detach().float()
    drafter = Eagle3Drafter.from_pretrained(folder, embed_tokens_weight=embed)
    return drafter.float().to(target.device).eval(), list(layer_ids or [])


def load_block(folder: str | os.PathLike, target, target_dir: str | os.PathLike):
    """A block drafter folder (DFlash, DSpark) in float32 eval mode around the target's
    embedding and lm_head, and the layer-output ids it reads; refused, naming every fault,
    when SGLang would load it wrongly or it does not fit the target."""
    from specbuild.block_export import config_from_export
    from specbuild.drafter.block import load_block_drafter
    from specbuild.drafter.teacher import read_target_weights
    from specbuild.eagle.text_model import text_config
    from specbuild.export import export_faults

    folder = Path(folder)
    hf = read_json(folder / "config.json")
    faults = export_faults(folder)
    text = text_config(read_json(Path(target_dir) / "config.json"))
    for key in ("hidden_size", "vocab_size"):
        if hf.get(key) != text.get(key):
            faults.append(f"{key} {hf.get(key)}, the target's is {text.get(key)}")
    if faults:
        raise ValueError(f"{folder} does not fit the target:\n  " + "\n  ".join(faults))
    cfg = config_from_export(hf)
    # the target's own, read from its folder: the loaded target's head may be repacked (oneDNN)
    names = ["model.embed_tokens.weight", "lm_head.weight"]
    weights = read_target_weights(target_dir, names)
    embed, head = (weights[n].float().to(target.device) for n in names)
    drafter = load_block_drafter(folder, cfg, embed, head)
    return drafter, [int(i) for i in hf["dflash_config"]["target_layer_ids"]]


def crop_cache(cache, length: int) -> None:
    """Roll a transformers DynamicCache back to its first `length` positions."""
    # transformers 5 reads a positive crop argument as a (rejected) legacy absolute length;
    # a negative one is the number of trailing positions to drop.
    drop = cache.get_seq_length() - length
    if drop > 0:
        cache.crop(-drop)


def cache_kwarg(model) -> str:
    """The keyword `model.forward` takes its KV cache under: `cache` (transformers 5.2x, which
    still accepts the deprecated `past_key_values`) or `past_key_values` (older releases, e.g.
    5.12, installed beside SGLang 0.5.17)."""
    return _cache_kwarg_of(type(model))


@functools.cache
def _cache_kwarg_of(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise TypeError(
        f"{cls.__name__}.forward takes neither `cache` nor `past_key_values`; "
        "the bench engine needs a transformers causal LM with a KV cache"
    )


def cached_forward(model, cache, input_ids: torch.Tensor, **kwargs):
    """`model(input_ids, <its cache keyword>=cache, use_cache=True, **kwargs)`, checked.

    Why: transformers' forward swallows unknown keywords (`**kwargs`), so a cache passed under
    the other release's name is dropped without a word; every forward then sees only its new
    tokens at positions 0.., the output is no longer the target's greedy decode and no draft
    is ever accepted (acceptance exactly 1.00 with transformers 5.12).
    """
    before = cache.get_seq_length()
    out = model(input_ids=input_ids, use_cache=True, **{cache_kwarg(model): cache}, **kwargs)
    if cache.get_seq_length() != before + input_ids.shape[1]:
        raise RuntimeError(
            f"the target did not extend its KV cache ({before} -> {cache.get_seq_length()} "
            f"positions after {input_ids.shape[1]} new tokens): its forward ignored the cache "
            f"keyword {cache_kwarg(model)!r}; check the transformers version"
        )
    return out


def _drafter_cache():
    from specbuild.drafter.model import DrafterCache

    return DrafterCache()


class HFBaseline:
    """Plain greedy decoding with a KV cache: the no-spec row every speedup is measured against."""

    name = "hf"
    chain = BASELINE
    drafter = NO_DRAFTER

    def __init__(self, target, *, eos_ids: set[int]):
        self.target = target
        self.eos_ids = eos_ids
        self.device = device_label(str(target.device))

    @torch.inference_mode()
    def complete(self, prompt_ids: list[int], max_new_tokens: int) -> Completion:
        from transformers import DynamicCache

        start = time.perf_counter()
        cache = DynamicCache()
        dev = self.target.device
        inputs = torch.tensor([prompt_ids], device=dev)
        out: list[int] = []
        ttft = None
        while True:
            # prefill scores only its last position: the rest of the prompt needs no logits
            logits = cached_forward(self.target, cache, inputs, logits_to_keep=1).logits
            token = int(logits[0, -1].argmax())
            out.append(token)
            ttft = ttft if ttft is not None else time.perf_counter() - start
            if token in self.eos_ids or len(out) >= max_new_tokens:
                break
            inputs = torch.tensor([[token]], device=dev)
        wall = time.perf_counter() - start
        return Completion(len(out), verify_steps=None, wall_s=wall, ttft_s=ttft, token_ids=out)


class HFSpecDecoder:
    """EAGLE-3 chain speculation (topk 1), greedy verification, KV rollback on both models."""

    name = "hf"

    def __init__(
        self,
        target,
        drafter: torch.nn.Module,
        *,
        layer_ids: Sequence[int],
        chain: Chain,
        eos_ids: set[int],
        drafter_name: str,
        new_cache: Callable[[], Any] | None = None,
    ):
        if not chain.is_chain:
            raise ValueError(f"chain {chain.name}: the hf engine drafts chains only (topk 1)")
        self.target = target
        self.device = device_label(str(target.device))
        self.drafter_model = drafter
        self.layer_ids = list(layer_ids)
        self.steps = chain.steps
        self.eos_ids = eos_ids
        self.chain = chain.name
        self.drafter = drafter_name
        self.new_cache = new_cache or _drafter_cache

    def _target_forward(
        self, ids: list[int], cache, *, last_only: bool = False
    ) -> tuple[list[int], torch.Tensor]:
        """Greedy next tokens and aux states [1, n, 3H] for `ids` appended to `cache`;
        `last_only` (prefill) scores only the last position, as the baseline does."""
        out = cached_forward(
            self.target,
            cache,
            torch.tensor([ids], device=self.target.device),
            output_hidden_states=True,
            logits_to_keep=1 if last_only else 0,
        )
        # hidden_states[0] is the embedding output, so layer id i is index i + 1
        aux = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        return out.logits[0].argmax(-1).tolist(), aux  # one host sync per forward

    def _draft(self, tokens: list[int], aux: torch.Tensor, cache) -> list[int]:
        """Extend the drafter with committed (token, aux) pairs, then draft `steps` target ids.

        The chain's own cache entries are cropped before returning, so the drafter cache again
        mirrors the target's committed prefix.
        """
        d = self.drafter_model
        start = cache.length
        dev = self.target.device
        pos = torch.arange(start, start + len(tokens), device=dev)[None]  # shape: [1, n]
        ids = torch.tensor([tokens], device=dev)
        hidden, logits = d(ids, d.project(aux), pos, cache=cache)
        committed = cache.length
        drafts: list[int] = []
        for step in range(self.steps):
            draft = d.draft_to_target(logits[:, -1].argmax(-1))  # shape: [1]
            drafts.append(int(draft))
            if step + 1 == self.steps:
                break
            pos = torch.tensor([[committed + step]], device=dev)
            hidden, logits = d(draft[:, None], hidden[:, -1:], pos, cache=cache)
        cache.crop(committed)
        return drafts

    def begin(self, prompt_ids: list[int], first: int, aux: torch.Tensor) -> Any:
        """The drafter's state after the prompt: its cache and the (token, aux) pairs it has
        yet to read. It sees each token beside the aux state of the position before it."""
        return [self.new_cache(), prompt_ids[1:] + [first], aux]

    def propose(self, state: Any, last: int) -> list[int]:
        cache, pending, pending_aux = state
        return self._draft(pending, pending_aux, cache)

    def commit(self, state: Any, tokens: list[int], aux: torch.Tensor) -> None:
        """The verify pass committed `tokens` (the accepted drafts and the bonus), whose aux
        states [1, n, 3H] come after the last token's."""
        state[1:] = [tokens, aux]

    @torch.inference_mode()
    def complete(self, prompt_ids: list[int], max_new_tokens: int) -> Completion:
        from transformers import DynamicCache

        start = time.perf_counter()
        t_cache = DynamicCache()
        preds, aux = self._target_forward(prompt_ids, t_cache, last_only=True)
        out = [preds[-1]]
        ttft = time.perf_counter() - start
        state = self.begin(prompt_ids, out[0], aux)
        accepted = [0] * self.steps
        steps = 0
        while out[-1] not in self.eos_ids and len(out) < max_new_tokens:
            drafts = self.propose(state, out[-1])
            base = t_cache.get_seq_length()
            preds, aux = self._target_forward([out[-1]] + drafts, t_cache)
            n = 0
            while n < len(drafts) and drafts[n] == preds[n]:
                n += 1
            new = drafts[:n] + [preds[n]]
            steps += 1
            for k in range(n):
                accepted[k] += 1
            # keep last + accepted drafts; the bonus becomes the new last
            crop_cache(t_cache, base + n + 1)
            self.commit(state, new, aux[:, : n + 1])
            for token in new:
                out.append(token)
                if token in self.eos_ids or len(out) >= max_new_tokens:
                    break
        wall = time.perf_counter() - start
        return Completion(
            len(out),
            verify_steps=steps,
            wall_s=wall,
            ttft_s=ttft,
            accepted_per_position=accepted,
            token_ids=out,
        )


class HFBlockDecoder(HFSpecDecoder):
    """Block speculation (DFlash, DSpark): each draft forward proposes the whole block after
    the last committed token, then the target verifies it as for a chain.

    The drafter's context cache holds the projected target features of every committed
    position; a verify pass appends those of the tokens it commits (the last one emitted and
    the accepted drafts), read from that same pass, exactly as SGLang's worker does.
    """

    def __init__(self, target, drafter, *, layer_ids, eos_ids: set[int], drafter_name: str):
        drafts = drafter.config.drafts
        super().__init__(
            target,
            drafter,
            layer_ids=layer_ids,
            chain=Chain(drafts, 1, drafts + 1),
            eos_ids=eos_ids,
            drafter_name=drafter_name,
        )

    def begin(self, prompt_ids: list[int], first: int, aux: torch.Tensor) -> Any:
        context = self.drafter_model.new_context()
        self.drafter_model.extend_context(context, aux)  # every prompt position
        return context

    def propose(self, state: Any, last: int) -> list[int]:
        return self.drafter_model.draft(state, last)

    def commit(self, state: Any, tokens: list[int], aux: torch.Tensor) -> None:
        # the features of the last token and the accepted drafts (the bonus has none yet)
        self.drafter_model.extend_context(state, aux)


@contextmanager
def open_hf(
    *,
    target_dir: str | os.PathLike,
    chain: str,
    drafter_dir: str | None,
    drafter_name: str,
    options: Mapping[str, Any],
) -> Iterator[HFBaseline | HFSpecDecoder]:
    """The PyTorch engine (or its baseline) over a materialized target folder, in this job.

    `options` (config `bench.hf`): dtype, device ("auto" takes CUDA when present), threads
    (`workers` is run_bench's: that many of these engines, in as many processes).
    """
    from specbuild.eagle.target_info import load_tokenizer
    from specbuild.infra.devices import resolve_device
    from specbuild.target import load_target_model

    device = resolve_device(options["device"])
    torch.set_num_threads(options["threads"])
    target = load_target_model(target_dir, dtype=options["dtype"], device=device)
    eos = eos_token_ids(target, load_tokenizer(target_dir))
    if chain == BASELINE:
        yield HFBaseline(target, eos_ids=eos)
        return
    if drafter_dir is None:
        raise ValueError(f"chain {chain!r} needs a drafter folder")
    target_config = read_json(Path(target_dir) / "config.json")
    if family_of(read_json(Path(drafter_dir) / "config.json")):
        drafter, layer_ids = load_block(drafter_dir, target, target_dir)
        decoder = HFBlockDecoder(
            target, drafter, layer_ids=layer_ids, eos_ids=eos, drafter_name=drafter_name
        )
        if decoder.chain != chain:
            raise ValueError(
                f"{drafter_dir} drafts blocks of {decoder.steps}: it benches at chain "
                f"{decoder.chain} only, not {chain!r}"
            )
        yield decoder
        return
    drafter, layer_ids = load_drafter(drafter_dir, target, target_config)
    yield HFSpecDecoder(
        target,
        drafter,
        layer_ids=layer_ids,
        chain=Chain.parse(chain),
        eos_ids=eos,
        drafter_name=drafter_name,
    )
