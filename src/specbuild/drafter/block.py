"""Block drafters (DFlash, DSpark): one forward pass drafts a whole block of tokens.

The contract is SGLang 0.5.17's draft forward (`srt/models/dflash.py`, `dspark.py`, the
workers in `srt/speculative/`), so a checkpoint trained here serves there unchanged:

    context   the target's layer outputs g[t] (K layers concatenated) of every committed
              position t < P, projected once: c[t] = hidden_norm(fc(g[t])); each draft layer
              keeps k_norm(k_proj(c[t])) (RoPE at t) and v_proj(c[t]) as its KV cache. No
              input_layernorm on the context: SGLang writes those keys straight from c.
    block     [anchor, mask, ..., mask] at positions P .. P+S-1, the anchor being the token
              the target emitted last (not yet in its cache, so not in the context either),
              embedded by the target's embedding; S query rows attend to every context key
              plus the whole block (bidirectional inside it), through `num_layers` pre-norm
              Qwen3-style layers (per-head q_norm/k_norm), then `norm`.
    logits    the target's own lm_head over the block rows:
              DFlash  S = drafts + 1; block row j >= 1 predicts the token at P + j.
              DSpark  S = drafts; row j predicts the token at P + j + 1, plus a Markov bias
                      markov_w2(markov_w1[previous token]) (the anchor for j = 0, the draft
                      before it after that), applied one row at a time.

Both propose `drafts` tokens and the target verifies drafts + 1 positions. `drafts` of the
families at equal verify width: a DFlash block of 8 is a DSpark gamma of 7.

Module names are the checkpoint's tensor names (`layers.{i}.self_attn.q_proj`, `fc`,
`hidden_norm`, `norm`, `markov_head.markov_w1`, ...); the target's embedding and lm_head ride
along frozen and are never exported.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specbuild.drafter.config import rope_from_hf, rope_inv_freq
from specbuild.drafter.model import MLP, RMSNorm, rotate_half
from specbuild.eagle.text_model import text_config

__all__ = [
    "BLOCK_FAMILIES",
    "BlockConfig",
    "BlockContext",
    "BlockDrafter",
    "chunked_cross_entropy",
    "load_block_drafter",
]

BLOCK_FAMILIES = ("dflash", "dspark")


@dataclass
class BlockConfig:
    family: str  # dflash | dspark
    drafts: int  # tokens proposed per verify (the verify width is drafts + 1)
    num_layers: int
    hidden_size: int  # = the target's: its embedding feeds the block, its lm_head reads it
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    mask_token_id: int  # an id the target's vocabulary already holds (SGLang adds none)
    mask_token: str = ""  # its text: SGLang's DFlash checks it against the tokenizer's id
    num_context_features: int = 3  # target layers concatenated into fc
    markov_rank: int = 0  # DSpark's low-rank previous-token bias; 0 for DFlash
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    hidden_act: str = "silu"

    def __post_init__(self) -> None:
        faults = []
        if self.family not in BLOCK_FAMILIES:
            faults.append(f"family {self.family!r}: choose {' or '.join(BLOCK_FAMILIES)}")
        if self.drafts < 1:
            faults.append(f"drafts {self.drafts} must be >= 1")
        if self.num_layers < 1:
            faults.append(f"num_layers {self.num_layers} must be >= 1")
        if self.family == "dspark" and self.markov_rank < 1:
            faults.append("dspark needs markov_rank >= 1 (SGLang refuses a draft without one)")
        if self.family == "dflash" and self.markov_rank:
            faults.append("dflash has no Markov head: markov_rank must be 0")
        if not 0 <= self.mask_token_id < self.vocab_size:
            faults.append(f"mask_token_id {self.mask_token_id} outside the vocabulary")
        if self.hidden_act != "silu":
            faults.append(f"hidden_act {self.hidden_act!r}: SGLang's block drafts run only silu")
        if self.num_attention_heads % self.num_key_value_heads:
            faults.append("num_attention_heads must be a multiple of num_key_value_heads")
        if faults:
            raise ValueError("BlockConfig: " + "; ".join(faults))

    @property
    def block_len(self) -> int:
        """Rows of one draft forward: the anchor and its masks."""
        return self.drafts + 1 if self.family == "dflash" else self.drafts

    @property
    def first_row(self) -> int:
        """The block row whose output predicts the first draft token."""
        return 1 if self.family == "dflash" else 0

    @classmethod
    def from_target(
        cls,
        target: dict,
        *,
        family: str,
        drafts: int,
        num_layers: int,
        mask_token_id: int,
        mask_token: str = "",
        markov_rank: int = 0,
        num_context_features: int = 3,
    ) -> BlockConfig:
        """Shapes and RoPE from the target's config.json: the block runs in its hidden size."""
        cfg = text_config(target)
        heads = int(cfg["num_attention_heads"])
        return cls(
            family=family,
            drafts=drafts,
            num_layers=num_layers,
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            vocab_size=int(cfg["vocab_size"]),
            mask_token_id=mask_token_id,
            mask_token=mask_token,
            num_context_features=num_context_features,
            markov_rank=markov_rank,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            hidden_act=str(cfg.get("hidden_act", "silu")),
            **rope_from_hf(cfg),
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> BlockConfig:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x * cos + rotate_half(x) * sin


class BlockAttention(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        h, nh, nkv, hd = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(h, nh * hd, bias=False)
        self.k_proj = nn.Linear(h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)  # per head, before RoPE (Qwen3)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.hd).transpose(1, 2)  # shape: [B,n,T,hd]

    def context_kv(self, ctx: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of projected context rows ctx [B,T,H] at RoPE (cos, sin) [B,T,hd]."""
        k = self.k_norm(self._heads(self.k_proj(ctx), self.nkv))
        v = self._heads(self.v_proj(ctx), self.nkv)
        return _rope(k, cos[:, None].to(k.dtype), sin[:, None].to(k.dtype)), v

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        ctx_k: Tensor,
        ctx_v: Tensor,
        ctx_visible: Tensor,
        block_len: int,
    ) -> Tensor:
        """x [B,N*S,H]: N blocks of S rows. Row r of block n attends to context keys where
        ctx_visible [B,N*S,T] (or broadcastable) is True, and to every row of its own block."""
        B, R, _ = x.shape
        N, S = R // block_len, block_len
        c, s = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
        q = _rope(self.q_norm(self._heads(self.q_proj(x), self.nh)), c, s)  # [B,nh,R,hd]
        k = _rope(self.k_norm(self._heads(self.k_proj(x), self.nkv)), c, s)  # [B,nkv,R,hd]
        v = self._heads(self.v_proj(x), self.nkv)
        g = self.nh // self.nkv  # GQA: kv head j serves query heads j*g .. j*g+g-1
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        ck, cv = ctx_k.repeat_interleave(g, 1), ctx_v.repeat_interleave(g, 1)
        scale = self.hd**-0.5
        to_ctx = (q @ ck.transpose(-1, -2)) * scale  # shape: [B,nh,R,T]
        to_ctx = to_ctx.masked_fill(~ctx_visible[:, None], float("-inf"))
        qb = q.view(B, self.nh, N, S, self.hd)
        to_block = (qb @ k.view(B, self.nh, N, S, self.hd).transpose(-1, -2)) * scale
        scores = torch.cat([to_ctx, to_block.reshape(B, self.nh, R, S)], -1)
        probs = scores.float().softmax(-1).to(q.dtype)  # every row sees its own block
        T = ck.shape[2]
        out = probs[..., :T] @ cv  # shape: [B,nh,R,hd]
        pb = probs[..., T:].reshape(B, self.nh, N, S, S)
        out = out + (pb @ v.view(B, self.nh, N, S, self.hd)).reshape(B, self.nh, R, self.hd)
        return self.o_proj(out.transpose(1, 2).reshape(B, R, self.nh * self.hd))


class BlockLayer(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = BlockAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, cos, sin, ctx_k, ctx_v, ctx_visible, block_len: int) -> Tensor:
        a = self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, ctx_visible, block_len)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    """DSpark's vanilla Markov head: a low-rank bias on the logits from the previous token."""

    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def forward(self, prev_ids: Tensor) -> Tensor:
        return self.markov_w2(self.markov_w1(prev_ids))  # shape: [...,V]


@dataclass
class BlockContext:
    """A served sequence's draft KV cache: per layer, the context keys and values so far."""

    keys: list[Tensor]  # [1,nkv,T,hd] each
    values: list[Tensor]

    @property
    def length(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0


class BlockDrafter(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.config = cfg
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)  # the target's, frozen
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False)  # the target's, frozen
        self.lm_head.weight.requires_grad_(False)
        self.fc = nn.Linear(cfg.num_context_features * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(BlockLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        if cfg.markov_rank:
            self.markov_head = MarkovHead(cfg.vocab_size, cfg.markov_rank)
        self.inv_freq = rope_inv_freq(cfg)  # an attribute: never rounded by .to(bfloat16)
        for m in self.modules():
            if isinstance(m, nn.Linear) and m is not self.lm_head:
                nn.init.normal_(m.weight, std=0.02)
        if cfg.markov_rank:  # a zero bias to start: the block's own logits first
            nn.init.normal_(self.markov_head.markov_w1.weight, std=0.02)
            nn.init.zeros_(self.markov_head.markov_w2.weight)

    FROZEN = ("embed_tokens.weight", "lm_head.weight")

    def export_state(self) -> dict[str, Tensor]:
        """Every tensor of the checkpoint: all but the target's embedding and lm_head."""
        return {k: v for k, v in self.state_dict().items() if k not in self.FROZEN}

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)
        emb = torch.cat([freqs, freqs], -1)
        return emb.cos(), emb.sin()  # shape: [B,T,hd]

    def project(self, aux: Tensor) -> Tensor:
        """The target's K concatenated layer outputs [B,T,K*H] -> context rows [B,T,H]."""
        return self.hidden_norm(self.fc(aux.to(self.fc.weight.dtype)))

    def _run(self, ids: Tensor, positions: Tensor, kv: list[tuple[Tensor, Tensor]], visible):
        x = self.embed_tokens(ids).to(self.fc.weight.dtype)
        cos, sin = self.rope(positions)
        S = self.config.block_len
        for layer, (ck, cv) in zip(self.layers, kv, strict=True):
            x = layer(x, cos, sin, ck, cv, visible, S)
        return self.norm(x)

    def forward(self, aux: Tensor, block_ids: Tensor, block_pos: Tensor, anchors: Tensor) -> Tensor:
        """Training: every sample's N blocks in one pass.

        aux [B,L,K*H] (index t at position t); block_ids, block_pos [B,N,S]; anchors [B,N]:
        block n of sample b sees the context at indices <= anchors[b,n] (its anchor token
        sits at position anchors + 1, the next one). Returns the normed rows [B,N,S,H].
        """
        B, N, S = block_ids.shape
        L = aux.shape[1]
        ctx = self.project(aux)
        cos, sin = self.rope(torch.arange(L, device=aux.device)[None].expand(B, L))
        kv = [layer.self_attn.context_kv(ctx, cos, sin) for layer in self.layers]
        t = torch.arange(L, device=aux.device)
        visible = t[None, None, :] <= anchors[:, :, None]  # shape: [B,N,L]
        visible = visible[:, :, None, :].expand(B, N, S, L).reshape(B, N * S, L)
        out = self._run(block_ids.reshape(B, N * S), block_pos.reshape(B, N * S), kv, visible)
        return out.view(B, N, S, -1)

    def logits(self, rows: Tensor) -> Tensor:
        return self.lm_head(rows.to(self.lm_head.weight.dtype))

    # serving (the PyTorch bench engine): one sequence, its context grown as tokens commit
    def new_context(self) -> BlockContext:
        return BlockContext([], [])

    def extend_context(self, context: BlockContext, aux: Tensor) -> None:
        """Append the committed positions' target features aux [1,n,K*H] (positions follow)."""
        start, n = context.length, aux.shape[1]
        pos = torch.arange(start, start + n, device=aux.device)[None]
        cos, sin = self.rope(pos)
        ctx = self.project(aux)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.context_kv(ctx, cos, sin)
            if i < len(context.keys):
                context.keys[i] = torch.cat([context.keys[i], k], 2)
                context.values[i] = torch.cat([context.values[i], v], 2)
            else:
                context.keys.append(k)
                context.values.append(v)

    def block_rows(self, context: BlockContext, anchor: int) -> Tensor:
        """The normed rows [S,H] of the block after `anchor` (the target's last emitted
        token, at position context.length), over the whole context."""
        cfg, dev = self.config, self.fc.weight.device
        P, S = context.length, cfg.block_len
        ids = torch.full((1, S), cfg.mask_token_id, dtype=torch.long, device=dev)
        ids[0, 0] = anchor
        pos = torch.arange(P, P + S, device=dev)[None]
        visible = torch.ones(1, S, P, dtype=torch.bool, device=dev)
        kv = list(zip(context.keys, context.values, strict=True))
        return self._run(ids, pos, kv, visible)[0]

    def draft(self, context: BlockContext, anchor: int) -> list[int]:
        """Greedy drafts after `anchor`: `drafts` target ids, as SGLang's worker proposes."""
        cfg = self.config
        rows = self.block_rows(context, anchor)[cfg.first_row : cfg.first_row + cfg.drafts]
        base = self.logits(rows).float()
        if not cfg.markov_rank:
            return base.argmax(-1).tolist()
        drafts, prev = [], torch.tensor(anchor, device=base.device)
        for j in range(cfg.drafts):  # each row's bias reads the token drafted before it
            prev = (base[j] + self.markov_head(prev).float()).argmax(-1)
            drafts.append(int(prev))
        return drafts


def chunked_cross_entropy(
    rows: Tensor,
    head: Tensor,
    labels: Tensor,
    *,
    bias: nn.Module | None = None,
    prev: Tensor | None = None,
    chunk: int = 2048,
) -> Tensor:
    """Per-row cross-entropy of lm_head(rows) [+ bias(prev)] [M,V] against labels [M],
    `chunk` rows at a time, the logits recomputed in the backward pass: a block drafter's
    rows times the target's whole vocabulary would not fit in memory at once."""
    from torch.utils.checkpoint import checkpoint

    def part(x: Tensor, y: Tensor, p: Tensor | None) -> Tensor:
        logits = (x @ head.t()).float()
        if bias is not None:
            logits = logits + bias(p).float()
        return F.cross_entropy(logits, y, reduction="none")

    out = [
        checkpoint(
            part,
            rows[i : i + chunk],
            labels[i : i + chunk],
            None if prev is None else prev[i : i + chunk],
            use_reentrant=False,
        )
        for i in range(0, rows.shape[0], chunk)
    ]
    return torch.cat(out) if out else rows.new_zeros(0, dtype=torch.float32)


def load_block_drafter(
    folder, cfg: BlockConfig, embed_tokens: Tensor, lm_head: Tensor, dtype=torch.float32
) -> BlockDrafter:
    """A block drafter folder's weights (safetensors, every name checked) around the target's
    embedding and lm_head."""
    from pathlib import Path

    from safetensors.torch import load_file

    state = load_file(str(Path(folder) / "model.safetensors"))
    with torch.device("meta"):
        model = BlockDrafter(cfg)
    model = model.to_empty(device=embed_tokens.device)
    model.inv_freq = rope_inv_freq(cfg)
    want = set(model.export_state())
    missing, extra = sorted(want - state.keys()), sorted(state.keys() - want)
    if missing or extra:
        raise ValueError(f"{folder}/model.safetensors: missing keys {missing}, unexpected {extra}")
    state["embed_tokens.weight"], state["lm_head.weight"] = embed_tokens, lm_head
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()
