"""The EAGLE-3 drafter: one Llama decoder layer over (token embedding, fused target features).

Weight names follow the checkpoints SGLang's `LlamaForCausalLMEagle3` loads (`fc`, `midlayer.*`,
`norm`, `lm_head`, `d2t`, `t2d`), so export is a rename-free copy. The failure guarded: a
drafter whose attention, RoPE or norms differ from what the server computes trains fine and
then accepts nothing. Everything the server needs to agree on lives in `DrafterConfig`.

One drafter step at position t (see `specbuild.drafter.train` for the full alignment):

    embed(token)  --input_layernorm--\\
                                      cat [2H] -> self_attn -> +h -> post_attention_layernorm
    h [H]         --hidden_norm------/                          -> mlp -> +  = h_out (pre-norm)
                                          logits = lm_head(norm(h_out)), over the draft vocab

h is fc(aux) (the target's low|mid|high layer outputs) at the first step and h_out of the
previous step afterwards (norm(h_out) with EAGLE-3.1's `norm_output`: SGLang then feeds back
the hidden its logits read), which is what "training-time test" unrolls.

self_attn is Llama's (q/k/v/o, `Attention`) or, for `DrafterConfig.mla`, DeepSeek's
multi-latent attention (`MLAttention`, SGLang's `Eagle3DeepseekV2ForCausalLM`): both hand
`attend` per-head queries, keys and values, MLA's values narrower than its queries and keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor, nn

from specbuild.drafter.config import (
    ATTENTION,
    DrafterConfig,
    rope_attention_factor,
    rope_inv_freq,
    softmax_scale,
)
from specbuild.drafter.fused_attention import fused_ttt_attention
from specbuild.eagle.layers import AUX_LAYERS

__all__ = ["ATTENTION", "DrafterConfig", "DrafterCache", "Eagle3Drafter", "ttt_attention"]


def rotate_half(x: Tensor) -> Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rotate_pairs(x: Tensor) -> Tensor:
    """rotate_half for RoPE on interleaved pairs (x0, x1), (x2, x3), ... (GPT-J style)."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()  # statistics in fp32 whatever the compute dtype, as HF and SGLang do
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(self.weight.dtype)


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# attend(q [B,nh,T,hd], k [B,nkv,T,hd], v [B,nkv,T,hv], scale) -> out [B,nh,T,hv]; scale
# multiplies q k^T (hv = hd but for MLA)
Attend = Callable[[Tensor, Tensor, Tensor, float], Tensor]


class Attention(nn.Module):
    """Llama attention whose q/k/v read the 2H concatenation; what it attends to is `attend`."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        nh, nkv, hd, h = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.hidden_size,
        )
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.scale = softmax_scale(cfg)
        self.q_proj = nn.Linear(2 * h, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)  # shape: [B,nh,T,hd]
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)  # shape: [B,nkv,T,hd]
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)  # shape: [B,nkv,T,hd]
        cos, sin = cos[:, None].to(q.dtype), sin[:, None].to(q.dtype)  # shape: [B,1,T,hd]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        out = attend(q, k, v, self.scale)  # shape: [B,nh,T,hd]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLAttention(nn.Module):
    """DeepSeek's multi-latent attention whose two down projections read the 2H concatenation
    (SGLang's Eagle3 MLA layer), in its plain form: latents expanded to per-head keys
    [nope | rope] and values; SGLang's absorbed form computes the same scores and outputs.

        q = q_b_proj(q_a_layernorm(q_a_proj(x)))              [nh, nope + rope]
        c, k_rope = kv_a_proj_with_mqa(x)                      [kv_lora], [rope] (one key)
        k_nope, v = kv_b_proj(kv_a_layernorm(c))               [nh, nope], [nh, v]
        RoPE on q's rope dims and k_rope only; k = [k_nope | k_rope] for every head
    """

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        h, nh = cfg.hidden_size, cfg.num_attention_heads
        self.nh, self.nope, self.rope = nh, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        self.kv_lora, self.hv = cfg.kv_lora_rank, cfg.v_head_dim
        self.interleave = cfg.rope_interleave
        self.scale = softmax_scale(cfg)
        self.q_a_proj = nn.Linear(2 * h, cfg.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, nh * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(2 * h, self.kv_lora + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(self.kv_lora, nh * (self.nope + self.hv), bias=False)
        self.o_proj = nn.Linear(nh * self.hv, h, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
        B, T, _ = x.shape
        nh, nope = self.nh, self.nope
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, nh, nope + self.rope).transpose(1, 2)  # shape: [B,nh,T,nope+rope]
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([self.kv_lora, self.rope], -1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent))
        kv = kv.view(B, T, nh, nope + self.hv).transpose(1, 2)  # shape: [B,nh,T,nope+hv]
        k_nope, v = kv.split([nope, self.hv], -1)
        rotate = rotate_pairs if self.interleave else rotate_half
        cos, sin = cos[:, None].to(q.dtype), sin[:, None].to(q.dtype)  # shape: [B,1,T,rope]
        q_rope, k_rope = q[..., nope:], k_rope[:, None].to(q.dtype)  # k_rope: [B,1,T,rope]
        q_rope = q_rope * cos + rotate(q_rope) * sin
        k_rope = k_rope * cos + rotate(k_rope) * sin
        q = torch.cat([q[..., :nope], q_rope], -1)
        k = torch.cat([k_nope, k_rope.expand(-1, nh, -1, -1)], -1)  # shape: [B,nh,T,nope+rope]
        out = attend(q, k, v, self.scale)  # shape: [B,nh,T,hv]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, nh * self.hv))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAttention(cfg) if cfg.mla else Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, embeds: Tensor, hidden: Tensor, cos: Tensor, sin: Tensor, attend: Attend):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], -1)  # [B,T,2H]
        h = hidden + self.self_attn(x, cos, sin, attend)  # shape: [B,T,H]
        return h + self.mlp(self.post_attention_layernorm(h))  # shape: [B,T,H]


def _expand_kv(x: Tensor, nh: int) -> Tensor:
    # GQA: kv head j serves query heads j*g .. j*g+g-1 (HF repeat_kv order)
    return x if x.shape[1] == nh else x.repeat_interleave(nh // x.shape[1], dim=1)


def ttt_attention(
    q: Tensor, keys: list[Tensor], values: list[Tensor], scale: float | None = None
) -> Tensor:
    """Training-time-test attention for unroll step i = len(keys) - 1.

    Query t attends causally to step-0 keys 0..t (the target-feature prefix, what the KV
    cache holds when serving) plus its own keys from steps 1..i (its draft chain), i.e.

        step 2, query t:   k0[0] k0[1] .. k0[t]   k1[t]   k2[t]

    keys[j]: [B,nh,>=T,hd], values[j]: [B,nh,>=T,hv] (GQA already expanded); q: [B,nh,T,hd];
    scale multiplies q k^T (default hd^-0.5).

    The reference: the definition the fused path (`fused_attention`) is tested against, and
    the CPU path (no compile). Memory-bound at real shapes: [B,nh,T,T] float32 scores a step.
    """
    T, scale = q.shape[2], q.shape[-1] ** -0.5 if scale is None else scale
    k0, v0 = keys[0][:, :, :T], values[0][:, :, :T]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    prefix = (q @ k0.transpose(-1, -2)) * scale  # shape: [B,nh,T,T]
    prefix = prefix.masked_fill(~causal, float("-inf"))
    own = [(q * k[:, :, :T]).sum(-1, keepdim=True) * scale for k in keys[1:]]  # [B,nh,T,1] each
    probs = torch.cat([prefix, *own], -1).float().softmax(-1).to(q.dtype)  # shape: [B,nh,T,T+i]
    out = probs[..., :T] @ v0  # shape: [B,nh,T,hv]
    for j, v in enumerate(values[1:]):
        out = out + probs[..., T + j : T + j + 1] * v[:, :, :T]
    return out


class DrafterCache:
    """KV cache for serving-style drafting: append per forward, `crop(n)` to roll back."""

    def __init__(self) -> None:
        self.k: Tensor | None = None  # shape: [B,nkv,length,hd]
        self.v: Tensor | None = None  # shape: [B,nkv,length,hv]

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], 2)
        self.v = v if self.v is None else torch.cat([self.v, v], 2)
        return self.k, self.v

    def crop(self, n: int) -> None:
        """Keep the first n positions (drop rejected drafts)."""
        if not 0 <= n <= self.length:
            raise ValueError(f"crop({n}) outside the cache length {self.length}")
        if self.k is not None:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]


def _cached_attend(cache: DrafterCache | None, nh: int) -> Attend:
    def attend(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        if cache is not None:
            k, v = cache.append(k, v)
        T, S = q.shape[2], k.shape[2]  # new queries sit at positions S-T .. S-1
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
        keys, values = _expand_kv(k, nh), _expand_kv(v, nh)
        scores = (q @ keys.transpose(-1, -2)) * scale  # shape: [B,nh,T,S]
        probs = scores.masked_fill(~mask, float("-inf")).float().softmax(-1).to(q.dtype)
        return probs @ values  # shape: [B,nh,T,hv]

    return attend


class Eagle3Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # the target's, frozen
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(
                RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(AUX_LAYERS)
            )
        self.fc = nn.Linear(AUX_LAYERS * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = DecoderLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        # A plain attribute, not a buffer: `.to(bfloat16)` must never round RoPE frequencies.
        self.inv_freq = rope_inv_freq(cfg)
        self.rope_factor = rope_attention_factor(cfg)  # YaRN's mscale on cos/sin (MLA), else 1
        self.rope_pairs = cfg.mla and cfg.rope_interleave  # cos/sin laid out per pair
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)  # HF Llama initializer_range

    def project(self, aux: Tensor) -> Tensor:
        """Fuse the target's low|mid|high states [B,T,3H_t] into the drafter's hidden [B,T,H]."""
        if self.config.fc_norm:
            parts = aux.chunk(AUX_LAYERS, dim=-1)
            aux = torch.cat([n(p) for n, p in zip(self.fc_norm, parts, strict=True)], -1)
        return self.fc(aux.to(self.fc.weight.dtype))  # shape: [B,T,H]

    def rope(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        inv_freq = self.inv_freq.to(position_ids.device)
        freqs = position_ids[..., None].float() * inv_freq  # shape: [B,T,d/2]
        if self.rope_pairs:  # frequency i turns dims 2i and 2i+1
            emb = freqs.repeat_interleave(2, -1)  # shape: [B,T,d]
        else:  # frequency i turns dims i and i + d/2
            emb = torch.cat([freqs, freqs], -1)  # shape: [B,T,d]
        if self.rope_factor != 1.0:
            return emb.cos() * self.rope_factor, emb.sin() * self.rope_factor
        return emb.cos(), emb.sin()

    def step(self, input_ids: Tensor, hidden: Tensor, position_ids: Tensor, attend: Attend):
        """One drafter step -> pre-norm hidden h_out [B,T,H] (its logits read norm(h_out); the
        next step reads `feedback(h_out)`)."""
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)  # shape: [B,T,H]
        cos, sin = self.rope(position_ids)
        return self.midlayer(embeds, hidden, cos, sin, attend)

    def logits(self, hidden_out: Tensor) -> Tensor:
        return self.lm_head(self.norm(hidden_out))  # shape: [...,Vd]

    def feedback(self, hidden_out: Tensor) -> Tensor:
        """The hidden the next draft step reads: h_out, or with EAGLE-3.1's `norm_output`
        norm(h_out), the hidden the logits read (what SGLang returns as the draft's aux)."""
        return self.norm(hidden_out) if self.config.norm_output else hidden_out

    def forward(
        self,
        input_ids: Tensor,
        hidden: Tensor,
        position_ids: Tensor,
        cache: DrafterCache | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Serving-style step: causal over `cache` (appended to) plus the new positions.

        input_ids [B,T]; hidden [B,T,H] (`project(aux)` for target features, or the hidden the
        previous step returned); position_ids [B,T] continue the cache's positions.
        Returns (the hidden the next step reads [B,T,H]: `feedback(h_out)`, logits [B,T,Vd]
        over the draft vocab).
        """
        h = self.step(
            input_ids, hidden, position_ids, _cached_attend(cache, self.config.num_attention_heads)
        )
        return self.feedback(h), self.logits(h)

    def unroll(
        self,
        input_ids: Tensor,
        aux: Tensor,
        position_ids: Tensor,
        steps: int,
        attention: str = "reference",
    ) -> list[Tensor]:
        """Training-time test: `steps` chained drafter steps over a whole batch.

        input_ids [B,L] hold the step-0 tokens (index t: the token after the feature's, see
        train.py); step i reads input_ids shifted left by i at positions + i and its own
        hidden from step i-1 (`feedback`). Returns the pre-norm hidden h_out of each step, step
        i over indices 0 .. L-1-i (later indices would read past the sequence).

        attention: how each step attends (the same attention, see ATTENTION): `reference`
        (`ttt_attention`), or `flex` (`fused_attention.fused_ttt_attention`, compiled on CUDA).
        """
        if attention not in ATTENTION:
            raise ValueError(f"attention {attention!r}: choose {' or '.join(ATTENTION)}")
        nh, L = self.config.num_attention_heads, input_ids.shape[1]
        n = min(steps, L)
        keys: list[Tensor] = []
        values: list[Tensor] = []

        def attend(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
            if attention == "flex":  # GQA inside the kernel: keys stay [B,nkv,T,hd]
                keys.append(k)
                values.append(v)
                return fused_ttt_attention(q, keys, values, segments=n, scale=scale)
            keys.append(_expand_kv(k, nh))
            values.append(_expand_kv(v, nh))
            return ttt_attention(q, keys, values, scale)

        hidden, outs = self.project(aux), []
        for i in range(n):
            T = L - i  # shape: step i covers indices [0, T)
            out = self.step(input_ids[:, i:], hidden[:, :T], position_ids[:, :T] + i, attend)
            outs.append(out)
            hidden = self.feedback(out)
        return outs

    def draft_to_target(self, draft_ids: Tensor) -> Tensor:
        return draft_ids + self.d2t[draft_ids]

    def export_state(self) -> dict[str, Tensor]:
        """Every tensor of the checkpoint: all but the target's embedding (and derived RoPE)."""
        return {k: v for k, v in self.state_dict().items() if k != "embed_tokens.weight"}

    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        embed_tokens_weight: Tensor,
        *,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
    ) -> Eagle3Drafter:
        """Load an EAGLE-3 folder strictly; the embedding comes from the target."""
        folder = Path(folder)
        cfg = DrafterConfig.from_export(json.loads((folder / "config.json").read_text()))
        state = load_file(str(folder / "model.safetensors"))
        dtype = dtype or next(v.dtype for v in state.values() if v.is_floating_point())
        with torch.device("meta"):
            model = cls(cfg)
        model = model.to_empty(device=device)
        model.inv_freq = rope_inv_freq(cfg)
        # SGLang gives every EAGLE-3 drafter the target's embedding (set_embed), so one that a
        # folder carries (SpecForge exports do) is never used there: it is not used here either
        state.pop("embed_tokens.weight", None)
        want = set(model.export_state())
        missing, extra = sorted(want - state.keys()), sorted(state.keys() - want)
        if missing or extra:
            raise ValueError(
                f"{folder}/model.safetensors: missing keys {missing}, unexpected {extra}"
            )
        if tuple(embed_tokens_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ValueError(
                f"embed_tokens_weight shape {tuple(embed_tokens_weight.shape)}, the drafter needs "
                f"[{cfg.vocab_size}, {cfg.hidden_size}] (is it the right target?)"
            )
        state["embed_tokens.weight"] = embed_tokens_weight
        model.load_state_dict(state, strict=True)
        return model.to(dtype).eval()
