"""Configuration: the drafter's architecture (`DrafterConfig`) and training (`TrainConfig`).

`DrafterConfig` holds the shape and RoPE facts the server must agree on: `from_target` reads
them from the target's config.json (transformers 4 or 5 layout), `from_export` back from an
exported drafter's config.json.

Attention (`train.draft_attention`, resolved by `draft_attention`): `gqa`, the Llama layer's
q/k/v/o with the target's heads and RoPE (SGLang's `LlamaForCausalLMEagle3`); `mla`, the
target's own multi-latent attention sizes (DeepSeek-V3, Kimi-K2.5; SGLang's
`Eagle3DeepseekV2ForCausalLM`), RoPE on its rope dims only, interleaved as the target's
`rope_interleave` says, and any rope scaling as DeepSeek's YaRN: SGLang's MLA layer serves every
scaling so, with cos/sin and the softmax scale multiplied by YaRN's mscale factors.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
from torch import Tensor

from specbuild.config.views import TRAIN_CADENCE
from specbuild.eagle.drafter_tensors import MLA_KEYS, DrafterShape
from specbuild.eagle.text_model import text_config
from specbuild.infra.devices import wants_cuda

__all__ = [
    "ATTENTION",
    "DRAFT_ATTENTION",
    "FAMILIES",
    "LOSS",
    "DrafterConfig",
    "TrainConfig",
    "draft_attention",
    "rope_attention_factor",
    "rope_from_hf",
    "rope_inv_freq",
    "softmax_scale",
]

ROPE_TYPES = ("default", "linear", "llama3")
# what an MLA draft's rope scaling may say: SGLang's MLA serves any scaling as DeepSeek's YaRN
MLA_ROPE_TYPES = ("default", "yarn", "deepseek_yarn")
# train.draft_attention (also `auto`): the drafter layer's attention, Llama's or DeepSeek's MLA
DRAFT_ATTENTION = ("gqa", "mla")
INITS = ("random", "target_last_layer")  # train.init
# train.family: eagle3, a chain drafting one token a forward (drafter/model.py); dflash and
# dspark, a block of tokens a forward (drafter/block.py). Defined once, here.
FAMILIES = ("eagle3", "dflash", "dspark")
# training-time-test attention, one attention two ways (`Eagle3Drafter.unroll`): reference,
# `ttt_attention`'s materialised scores (the CPU path); flex, one fused kernel a step
# (`fused_attention`, the CUDA path). train.attention also takes `auto` (flex on CUDA).
ATTENTION = ("reference", "flex")
# the training loss at each TTT step, one loss two ways (`TTTObjective`): reference, the
# lm_head's logits and their log-softmax as autograd sees them; fused, lm_head and loss in one
# pass over row chunks (`fused_loss`, less memory). train.loss also takes `auto` (fused on CUDA).
LOSS = ("reference", "fused")


@dataclass
class DrafterConfig:
    hidden_size: int  # = the target's: the embedding is shared with it
    intermediate_size: int  # MLP width (the target's, as EAGLE-3 drafters do)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary (embedding rows, t2d length)
    draft_vocab_size: int  # lm_head rows
    target_hidden_size: int  # fc takes 3 * this
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # HF legacy form with "rope_type"; None = plain RoPE
    max_position_embeddings: int = 4096
    fc_norm: bool = False  # EAGLE-3.1: RMSNorm on each aux state before fc
    hidden_act: str = "silu"
    # EAGLE-3.1: the next draft step reads norm(h_out), the hidden its logits read, instead of
    # the pre-norm h_out
    norm_output: bool = False
    # multi-latent attention (MLA_KEYS; all None: Llama attention). head_dim is then
    # qk_nope_head_dim + qk_rope_head_dim, the query/key width
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    rope_interleave: bool = True  # MLA: RoPE on interleaved pairs (GPT-J), else halves (NeoX)

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    def __post_init__(self) -> None:
        faults = []
        if self.num_attention_heads % self.num_key_value_heads:
            faults.append("num_attention_heads must be a multiple of num_key_value_heads")
        if self.hidden_act != "silu":
            faults.append(f"hidden_act {self.hidden_act!r}: only 'silu' (Llama MLP) is built")
        dims = {k: getattr(self, k) for k in MLA_KEYS}
        given = [k for k, v in dims.items() if v is not None]
        if given and len(given) < len(dims):
            missing = [k for k in dims if k not in given]
            faults.append(f"multi-latent attention needs {', '.join(missing)} too")
        elif given and self.qk_rope_head_dim % 2:
            faults.append(f"qk_rope_head_dim {self.qk_rope_head_dim} must be even (RoPE pairs)")
        elif given and self.head_dim != self.qk_nope_head_dim + self.qk_rope_head_dim:
            faults.append(
                f"head_dim {self.head_dim}: multi-latent attention's query/key width is "
                f"qk_nope_head_dim + qk_rope_head_dim = "
                f"{self.qk_nope_head_dim + self.qk_rope_head_dim}"
            )
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        allowed = MLA_ROPE_TYPES if given else ROPE_TYPES
        if rope_type not in allowed:
            faults.append(
                f"rope_type {rope_type!r} is not supported"
                + (" with multi-latent attention" if given else "")
                + f"; supported: {allowed}"
            )
        if faults:
            raise ValueError("DrafterConfig: " + "; ".join(faults))

    @classmethod
    def from_target(
        cls,
        target: dict,
        *,
        draft_vocab_size: int,
        fc_norm: bool = False,
        norm_output: bool = False,
        attention: str = "gqa",
    ) -> DrafterConfig:
        """Shape and RoPE facts from the target's HF config.json (legacy or `rope_parameters`);
        `attention` (DRAFT_ATTENTION, `draft_attention` resolves train's): `mla` takes the
        target's MLA sizes and rope_interleave."""
        cfg = text_config(target)
        heads = int(cfg["num_attention_heads"])
        if attention not in DRAFT_ATTENTION:
            raise ValueError(f"attention {attention!r}: choose {' or '.join(DRAFT_ATTENTION)}")
        mla = {k: int(cfg[k]) for k in MLA_KEYS} if attention == "mla" else {}
        if mla:
            head_dim, kv_heads = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"], heads
            mla["rope_interleave"] = bool(cfg.get("rope_interleave", True))  # SGLang's default
        else:
            head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
            kv_heads = int(cfg.get("num_key_value_heads") or heads)
        return cls(
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=int(cfg["vocab_size"]),
            draft_vocab_size=draft_vocab_size,
            target_hidden_size=int(cfg["hidden_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            fc_norm=fc_norm,
            hidden_act=str(cfg.get("hidden_act", "silu")),
            norm_output=norm_output,
            **mla,
            **rope_from_hf(cfg),
        )

    @classmethod
    def from_export(cls, hf: dict) -> DrafterConfig:
        """From an EAGLE-3 drafter's config.json: ours (specbuild.export.hf_config) or any other
        exporter's that SGLang loads (head_dim, key-value heads and draft vocabulary default
        the way a Llama config implies them)."""
        # the sizes, defaulted as SGLang reads a Llama config (other exporters, SpecForge's,
        # leave out what it implies): the one reading the parse-time check shares
        return cls(
            **asdict(DrafterShape.from_config(hf)),
            rms_norm_eps=float(hf["rms_norm_eps"]),
            max_position_embeddings=int(hf["max_position_embeddings"]),
            hidden_act=str(hf.get("hidden_act", "silu")),
            norm_output=bool(hf.get("norm_output", False)),
            rope_interleave=bool(hf.get("rope_interleave", True)),
            **rope_from_hf({k: v for k, v in hf.items() if k != "rope_parameters"}),
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DrafterConfig:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})


def draft_attention(choice: str, target: dict) -> str:
    """train.draft_attention resolved against the target's config.json (DRAFT_ATTENTION):
    `auto` is mla where the target's text config gives every MLA size (DeepSeek-V3,
    Kimi-K2.5), gqa elsewhere; `mla` for a target without them is refused, naming them."""
    text = text_config(target)
    missing = [k for k in MLA_KEYS if text.get(k) is None]
    if choice == "auto":
        return "gqa" if missing else "mla"
    if choice == "mla" and missing:
        raise ValueError(
            f"train.draft_attention mla: the target's config.json gives no {', '.join(missing)} "
            "(SGLang's MLA draft needs every one, q_lora_rank included); set it to gqa or auto"
        )
    if choice not in DRAFT_ATTENTION:
        raise ValueError(
            f"train.draft_attention {choice!r}: choose auto, {' or '.join(DRAFT_ATTENTION)}"
        )
    return choice


def rope_from_hf(cfg: dict) -> dict:
    # transformers >= 5 writes `rope_parameters`; older configs `rope_theta` + `rope_scaling`.
    params = dict(cfg.get("rope_parameters") or {})
    theta = float(params.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    scaling = params or cfg.get("rope_scaling") or None
    if scaling is not None:
        scaling = dict(scaling)
        scaling["rope_type"] = scaling.pop("type", None) or scaling.get("rope_type", "default")
        if scaling["rope_type"] == "default" and len(scaling) == 1:
            scaling = None
    return {"rope_theta": theta, "rope_scaling": scaling}


def rope_inv_freq(cfg: DrafterConfig) -> Tensor:
    """Inverse frequencies [rotary dims/2] (head_dim, or MLA's qk_rope_head_dim), with the
    target's scaling (same math as HF/SGLang). Block drafters' configs (Llama attention
    only) read it too."""
    mla = getattr(cfg, "mla", False)
    d = cfg.qk_rope_head_dim if mla else cfg.head_dim
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", "default")
    if mla and kind != "default":
        inv = _deepseek_yarn(inv, d, cfg)
    elif kind == "linear":
        inv = inv / scaling["factor"]
    elif kind == "llama3":  # Llama 3.1: stretch low frequencies, keep high, blend in between
        factor, old = scaling["factor"], scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = torch.where(medium, blended, scaled)
    return inv.float()


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _deepseek_yarn(inv: Tensor, d: int, cfg: DrafterConfig) -> Tensor:
    """DeepSeek's YaRN as SGLang's MLA computes it (its defaults where the config is silent):
    interpolated below the correction range, extrapolated above, a linear ramp between."""
    s = cfg.rope_scaling or {}
    factor = float(s.get("factor", 1.0))
    original = float(s.get("original_max_position_embeddings", cfg.max_position_embeddings))

    def dim(rotations: float) -> float:  # the dimension that turns `rotations` times
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))

    low = max(math.floor(dim(s.get("beta_fast", 32))), 0)
    high = min(math.ceil(dim(s.get("beta_slow", 1))), d - 1)
    span = high - low if high != low else 1e-3  # SGLang's guard against a zero-width ramp
    ramp = (torch.arange(d // 2, dtype=torch.float64) - low) / span
    keep = (1 - ramp.clamp(0, 1)) * s.get("extrapolation_factor", 1)
    return inv / factor * (1 - keep) + inv * keep


def rope_attention_factor(cfg: DrafterConfig) -> float:
    """What cos and sin are multiplied by: 1, but YaRN's mscale ratio for an MLA draft."""
    s = cfg.rope_scaling or {}
    if not cfg.mla or s.get("rope_type", "default") == "default":
        return 1.0
    factor = float(s.get("factor", 1.0))
    ratio = _yarn_mscale(factor, float(s.get("mscale", 1))) / _yarn_mscale(
        factor, float(s.get("mscale_all_dim", 0))
    )
    return ratio * float(s.get("attn_factor", 1))


def softmax_scale(cfg: DrafterConfig) -> float:
    """The attention logits' scale: head_dim^-0.5; an MLA draft's (nope+rope)^-0.5 times
    YaRN's mscale(factor, mscale_all_dim) squared under rope scaling, as SGLang's MLA."""
    scale = cfg.head_dim**-0.5
    s = cfg.rope_scaling or {}
    if not cfg.mla or s.get("rope_type", "default") == "default":
        return scale
    if not s.get("apply_yarn_scaling", True) or not s.get("apply_scale", True):
        return scale
    m = _yarn_mscale(float(s.get("factor", 1.0)), float(s.get("mscale_all_dim", 0)))
    return scale * m * m


@dataclass(frozen=True)
class TrainConfig:
    """Training hyper-parameters (config section `train`, reaching the job as params).

    Each default is the schema's (config/config.schema.yaml, `train`), repeated here for
    callers outside the workflow; tests/unit/config/test_schema.py keeps the two equal.

    Rejected combinations (`check`): max_length > token_budget, ttt_steps < 1, eval_fraction
    or warmup_fraction outside [0, 1), eval_set with eval_fraction > 0, device cuda without
    CUDA, nproc above the visible GPUs, attention flex on CPU, init
    target_last_layer with init_from, norm_output or draft_attention mla with a block family,
    and unknown keys (`from_params`).
    """

    ttt_steps: int = 7  # drafts chained in training-time test
    loss_decay: float = 0.8  # weight of step i is decay**i
    # Teacher softmax temperature: 1 = the target's distribution (EAGLE-3), < 1 sharpens it
    # toward its argmax (what greedy verification accepts), 0 = the argmax as a hard label.
    teacher_temperature: float = 1.0
    # Share of each step's loss taken by -log of the expected acceptance sum_v min(p_v, q_v)
    # (an LK-style loss: what verification accepts, not a proxy of it) instead of the soft
    # cross-entropy; 0: cross-entropy alone (EAGLE-3), 1: acceptance alone.
    acceptance_weight: float = 0.0
    lr: float = 1e-4
    warmup_fraction: float = 0.05  # share of all steps with linear warmup, then cosine to 0
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 0.5  # max global grad norm
    epochs: int = 1
    token_budget: int = 8192  # batch size x padded length per rank
    max_length: int = 2048  # longer samples keep their first max_length tokens
    group_by_length: bool = False  # batches of like-length samples (data.plan_batches)
    seed: int = 0
    eval_fraction: float = 0.05  # held-out samples (0: evaluate on the training set)
    eval_set: str | None = None  # a held-out dataset evaluated instead (its shards: eval_shards)
    eval_interval: int = 0  # steps between evals; 0: at the end of each epoch only
    save_interval: int = 200  # steps between resumable checkpoints
    log_interval: int = 10
    fc_norm: bool = False  # EAGLE-3.1 per-aux RMSNorm before fc
    norm_output: bool = False  # EAGLE-3.1: each draft step feeds the next its post-norm hidden
    # the drafter layer's attention: auto (mla for a target with MLA's sizes, gqa elsewhere;
    # `draft_attention`) | gqa (Llama's) | mla (the target's multi-latent attention)
    draft_attention: str = "auto"
    device: str = "auto"  # auto | cpu | cuda
    # auto (bf16 autocast on CUDA, float32 on CPU) | float32 | bfloat16 (autocast on CUDA and
    # on a CPU with native bf16, `cpu_bf16_supported`; float32 on other CPUs, where bf16 would
    # be emulated, slower than float32). fp32 master weights either way.
    precision: str = "auto"
    # training-time-test attention: auto (flex on CUDA, reference on CPU) | reference | flex
    attention: str = "auto"
    # the TTT loss: reference | fused (lm_head + loss over row chunks) | auto (fused on CUDA:
    # 1.21x the reference's tokens/s at the H200 example's shapes on synthetic batches,
    # BENCHMARKS.md, "train: speed and MFU")
    loss: str = "auto"
    nproc: int = 1  # processes (GPUs) for DDP through torchrun
    init_from: str = ""  # an EAGLE-3 drafter folder to warm-start from ("": random init)
    init: str = "random"  # random | target_last_layer (drafter/target_init.py)
    family: str = "eagle3"  # FAMILIES: what the drafter is (and what SGLang serves it as)
    # block families (dflash, dspark) only:
    block_drafts: int = 7  # tokens a block proposes; the verify width is block_drafts + 1
    block_layers: int = 3  # draft decoder layers
    block_anchors: int = 64  # blocks trained per sample per step (anchors drawn at random)
    markov_rank: int = 64  # dspark: rank of the previous-token logit bias
    mask_token_id: int | None = None  # the block's mask token; None: picked from the tokenizer

    @classmethod
    def from_params(cls, params: dict, **cadence: int | str) -> TrainConfig:
        """The job's params plus its TRAIN_CADENCE keys (resources: ints given as strings)."""
        names = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(params) - set(names)) + sorted(set(cadence) - set(TRAIN_CADENCE))
        if unknown:
            raise ValueError(f"train params: unknown key(s) {unknown}; known: {sorted(names)}")
        cfg = cls(**params, **{k: int(v) for k, v in cadence.items()})
        cfg.check()
        return cfg

    def check(self) -> None:
        faults = []
        if self.max_length > self.token_budget:
            faults.append(f"max_length {self.max_length} > token_budget {self.token_budget}")
        if self.ttt_steps < 1:
            faults.append("ttt_steps must be >= 1")
        if self.teacher_temperature < 0:
            faults.append("teacher_temperature must be >= 0 (0: the target's argmax)")
        if not 0 <= self.acceptance_weight <= 1:
            faults.append(f"acceptance_weight {self.acceptance_weight} must lie in [0, 1]")
        if self.eval_set is not None and self.eval_fraction > 0:
            faults.append(
                f"eval_set {self.eval_set!r} is held out for evaluation, so eval_fraction must "
                f"be 0 (it is {self.eval_fraction}: training samples nothing would evaluate)"
            )
        if not 0 <= self.eval_fraction < 1 or not 0 <= self.warmup_fraction < 1:
            faults.append("eval_fraction and warmup_fraction must lie in [0, 1)")
        if self.device not in ("auto", "cpu", "cuda"):
            faults.append(f"device {self.device!r}: choose auto, cpu or cuda")
        if self.init not in INITS:
            faults.append(f"init {self.init!r}: choose {' or '.join(INITS)}")
        if self.init != "random" and self.init_from:
            faults.append(
                f"init {self.init!r} and init_from {self.init_from!r}: a warm start replaces "
                "every weight; give one of them"
            )
        if self.family not in FAMILIES:
            faults.append(f"family {self.family!r}: choose {', '.join(FAMILIES)}")
        if self.family != "eagle3" and self.init_from:
            faults.append(
                f"family {self.family} and init_from {self.init_from!r}: a warm start reads "
                "EAGLE-3 drafters only"
            )
        if self.draft_attention not in ("auto", *DRAFT_ATTENTION):
            faults.append(
                f"draft_attention {self.draft_attention!r}: choose auto, "
                + " or ".join(DRAFT_ATTENTION)
            )
        if self.family != "eagle3" and (self.norm_output or self.draft_attention == "mla"):
            faults.append(
                f"family {self.family}: norm_output and draft_attention mla shape an EAGLE-3 "
                "drafter only (a block drafter reads the target's head and has Qwen3 attention)"
            )
        if min(self.block_drafts, self.block_layers, self.block_anchors, self.markov_rank) < 1:
            faults.append("block_drafts, block_layers, block_anchors and markov_rank must be >= 1")
        if self.precision not in ("auto", "float32", "bfloat16"):
            faults.append(f"precision {self.precision!r}: choose auto, float32 or bfloat16")
        cuda = wants_cuda(self.device)
        if self.device == "cuda" and not torch.cuda.is_available():
            faults.append("device cuda, but no CUDA GPU is visible")
        if cuda and self.nproc > torch.cuda.device_count():
            faults.append(f"nproc {self.nproc} > {torch.cuda.device_count()} visible GPUs")
        if self.attention not in ("auto", *ATTENTION):
            faults.append(f"attention {self.attention!r}: choose auto, {' or '.join(ATTENTION)}")
        if not cuda and self.attention == "flex":
            faults.append("attention flex needs CUDA (its backward has no CPU kernel)")
        if self.loss not in ("auto", *LOSS):
            faults.append(f"loss {self.loss!r}: choose auto, {' or '.join(LOSS)}")
        if faults:
            raise ValueError("train config: " + "; ".join(faults))
