"""Training-time-test attention without the T x T scores: one FlexAttention call per TTT step.

`model.ttt_attention` (the reference, and the CPU path) materialises every step's [B,nh,T,T]
scores in float32, masks the upper half and appends the i diagonal scores of the draft chain:
at Llama-3.1-8B shapes that was 45.7% of a training step's kernel time for 4.5% of its FLOPs.
Here the same attention is one fused flash-style kernel (`torch.nn.attention.flex_attention`,
compiled by Inductor to Triton on CUDA) over the keys laid end to end in segments of P:

    keys  = k0[0..T) pad | k1[0..T) pad | ... | ki[0..T) pad | (empty segments up to `segments`)
    query t (t < P) sees   k0[s] for s <= t     (segment 0, causal)
                           kj[t] for 1 <= j <= i (segment j, its own position only)

which is `ttt_attention`'s rule, so the result is the same softmax over the same scores (one
online softmax in float32 inside the kernel, instead of a float32 softmax of the
materialised scores; both round probabilities to the value dtype before the value product).
Why this design and not SDPA plus a log-sum-exp merge of the i diagonal keys: one kernel
computes the softmax and its gradient over all keys at once, so the gradient is flex's own
(nothing hand-derived to get wrong), and the block mask makes the diagonal keys cheap: each
query block reads one extra key block per draft step, next to its ~T/256 causal blocks.

Shapes, so that a training run compiles a handful of kernels and then none:
  * P is T rounded up to a power of two (>= BLOCK), so a run with max_length 2,048 sees at
    most five P; the sequence dims are marked static (one graph per P, never a dynamic-shape
    graph that could specialise on each length) and the batch dim dynamic (the token-budget
    packing varies it);
  * the key length is `segments` x P whatever the step (`unroll` passes its step count), so
    the TTT steps of a run share one graph; the segments no step has reached yet are zeros,
    masked, and never read (their blocks are not in the block mask);
  * the mask's varying numbers (P, the end of the live segments) are tensors the mask reads,
    not Python ints it closes over, so a new step or length changes data, not the graph.
  So a run compiles one graph per (P, grad mode) plus, at most, one for a batch of one:
  `compiled_graphs()` counts them and the trainer logs any that appear after warm-up.

The block mask (`block_mask`) is built from block arithmetic, not by evaluating the mask over
P x segments*P points each step: it is cached per (query blocks, P, step, segments). Query
blocks wholly past T are left out (no work; their rows are cut off anyway). The unit tests
check it block for block against `create_block_mask` of the mask function, and the fused
result and its gradients against `ttt_attention` (eager flex on CPU; compiled on CUDA).
"""

from __future__ import annotations

import functools
import sys

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["BLOCK", "available", "block_mask", "compiled_graphs", "fused_ttt_attention", "padded"]

BLOCK = 128  # FlexAttention's default sparse block: queries and keys per block-mask entry
RECOMPILE_LIMIT = 64  # graphs per run: one per (P, grad mode, batch of one or not), P <= ~6


def available() -> bool:
    """Whether this torch has FlexAttention (2.5+)."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def padded(T: int) -> int:
    """P: T rounded up to a power of two, at least one block (a multiple of BLOCK)."""
    P = BLOCK
    while P < T:
        P *= 2
    return P


def _mask_mod(bounds: Tensor):
    """Query q may see key kv: bounds = [P, (i+1) P] (int32, on the device), tensors so that
    neither changes the compiled graph."""

    def mask(b, h, q_idx, kv_idx):
        seg_len, live_end = bounds[0], bounds[1]
        causal = kv_idx <= q_idx  # segment 0 (q < P, so kv <= q lies in it)
        own = ((kv_idx - q_idx) % seg_len == 0) & (kv_idx > q_idx) & (kv_idx < live_end)
        return causal | own  # own: kv = q + j P, 1 <= j <= i: kj at q's own position

    return mask


@functools.lru_cache(maxsize=256)
def block_mask(q_blocks: int, P: int, step: int, segments: int, device: torch.device):
    """The BlockMask of TTT step `step` over `segments` segments of P, for the first
    `q_blocks` query blocks (the later ones are padding: no blocks, no work).

    Query block r: full blocks 0 .. r-1 of segment 0 (wholly causal), partial blocks r of
    segments 0 .. step (the causal diagonal, and each draft key at the query's own position).
    """
    from torch.nn.attention.flex_attention import BlockMask

    nb = P // BLOCK
    r = torch.arange(nb, device=device, dtype=torch.int32)  # shape: [nb] query blocks
    live = r < q_blocks
    cols = torch.arange(segments * nb, device=device, dtype=torch.int32)  # shape: [S nb]
    full_num = torch.where(live, r, 0)  # the first r entries of `cols` are blocks 0 .. r-1
    full_idx = cols.expand(nb, -1).contiguous()  # shape: [nb, S nb]
    seg = torch.arange(step + 1, device=device, dtype=torch.int32)
    part = seg[None, :] * nb + r[:, None]  # shape: [nb, step+1] ascending
    part_idx = torch.zeros(nb, segments * nb, device=device, dtype=torch.int32)
    part_idx[:, : step + 1] = part
    part_num = torch.where(live, step + 1, 0).to(torch.int32)
    bounds = torch.tensor([P, (step + 1) * P], dtype=torch.int32).to(device)
    return BlockMask.from_kv_blocks(
        part_num[None, None],
        part_idx[None, None],
        full_num[None, None],
        full_idx[None, None],
        BLOCK_SIZE=BLOCK,
        mask_mod=_mask_mod(bounds),
        seq_lengths=(P, segments * P),
    )


@functools.cache
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


@functools.cache
def _limits() -> dict:
    """Dynamo settings around the compiled call: room for the graphs a run needs, and more
    than that is an error to see, not a silent fall back to eager flex attention (which would
    materialise B x nh x P x segments*P float32 scores: tens of GB at 8B shapes)."""
    config = torch._dynamo.config
    wanted = {"recompile_limit": RECOMPILE_LIMIT, "fail_on_recompile_limit_hit": True}
    return {k: v for k, v in wanted.items() if hasattr(config, k)}


def compiled_graphs() -> int:
    """Graphs TorchDynamo has compiled in this process (all of them: the fused attention is
    the only compiled code of a training run)."""
    utils = sys.modules.get("torch._dynamo.utils")  # not imported: nothing was compiled (and
    if utils is None:  # a CPU run does not pay for importing the compiler)
        return 0
    return int(utils.counters["stats"]["unique_graphs"])


def _segments(xs: list[Tensor], T: int, P: int, segments: int) -> Tensor:
    """keys[j][:, :, :T] end to end, each padded to P, then zeros to `segments` x P."""
    B, n, _, hd = xs[0].shape
    parts = []
    for x in xs:
        parts += [x[:, :, :T], x.new_zeros(B, n, P - T, hd)]
    parts.append(xs[0].new_zeros(B, n, (segments - len(xs)) * P, hd))
    return torch.cat(parts, 2)  # shape: [B,n,segments P,hd]


def fused_ttt_attention(
    q: Tensor,
    keys: list[Tensor],
    values: list[Tensor],
    *,
    segments: int,
    compiled: bool | None = None,
    scale: float | None = None,
) -> Tensor:
    """`model.ttt_attention` for step i = len(keys) - 1, fused; the same arguments but GQA
    not expanded: q [B,nh,T,hd], keys[j] [B,nkv,>=T,hd], values[j] [B,nkv,>=T,hv] (nh a
    multiple of nkv; hv < hd for multi-latent attention), `segments` >= len(keys) (the run's
    step count: one graph for all its steps), `scale` on q k^T (default hd^-0.5).

    `compiled`: through torch.compile (default on CUDA). Eager flex attention is the readable
    definition (mask function over every score, float32 softmax) and runs on CPU, forward and,
    with its device check lifted (tests), backward.
    """
    from torch.nn.attention.flex_attention import flex_attention

    B, nh, T, hd = q.shape
    scale = hd**-0.5 if scale is None else scale
    if not 1 <= len(keys) <= segments or len(values) != len(keys):
        raise ValueError(f"{len(keys)} keys, {len(values)} values for {segments} segments")
    P = padded(T)
    kv = _segments(keys, T, P, segments), _segments(values, T, P, segments)
    q = F.pad(q, (0, 0, 0, P - T))  # shape: [B,nh,P,hd]
    mask = block_mask(-(-T // BLOCK), P, len(keys) - 1, segments, q.device)
    gqa = nh != keys[0].shape[1]
    if compiled is None:
        compiled = q.device.type == "cuda"
    if not compiled:
        out = flex_attention(q, *kv, block_mask=mask, scale=scale, enable_gqa=gqa)
        return out[:, :, :T]
    for t in (q, *kv):
        torch._dynamo.maybe_mark_dynamic(t, 0)  # batch size: varies with the packing
        torch._dynamo.mark_static(t, 2)  # sequence: one graph per P (see the module doc)
    with torch._dynamo.config.patch(_limits()):
        out = _compiled()(q, *kv, block_mask=mask, scale=scale, enable_gqa=gqa)
    return out[:, :, :T]  # shape: [B,nh,T,hv]
