"""A synthetic, learnable training workspace: target folder, vocab map and hidden-state shards.

Used by the unit tests (tiny, seeded) and by the GPU throughput run (target-sized shapes, no
model download): the files follow the real contracts, so `train_drafter` cannot tell.
Tokens walk a fixed permutation (x[t+1] = perm[x[t]]) inside the draft vocabulary, and the
target's `last` at t points at lm_head row x[t+1], so the next token is predictable from the
current one and a drafter that learns anything reaches high accuracy.

    python -m benchmarks.synthetic OUT [--preset llama8b|smollm2|kimi|kimi_mla|tiny] [--epochs N]
        [--profile]

writes OUT/{target,vocab,hidden} and OUT/spec.json (`--spec-only`: the spec alone, for the
workspace a previous call wrote there); then, printing tokens/s, TFLOP/s and MFU in the log:

    python -m benchmarks.train_speed OUT/spec.json                                    # 1 GPU
    torchrun --standalone --nproc_per_node 2 -m benchmarks.train_speed OUT/spec.json  # 2 GPUs

The run writes OUT/result.json (`train_speed`), or with `--profile` OUT/profile.json and
profile.txt (`train_profile`) and no result: the profiler slows the steps it watches.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specbuild.drafter.config import ATTENTION, LOSS
from specbuild.eagle.drafter_tensors import MLA_KEYS
from specbuild.eagle.layers import default_layer_ids
from specbuild.hidden.fp8 import quantize_fp8
from specbuild.hidden.shards import write_shard
from specbuild.infra.io import atomic_path, write_json
from specbuild.infra.safetensors_file import save_tensors

__all__ = ["SyntheticSpec", "PRESETS", "target_config", "make_workspace", "workspace_paths"]


@dataclass(frozen=True)
class SyntheticSpec:
    hidden_size: int = 64
    intermediate_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 256
    draft_vocab_size: int = 128
    num_hidden_layers: int = 8
    samples: int = 16
    seq_len: int = 24
    shards: int = 2
    aux_dtype: str = "bf16"  # bf16 | fp8 (aux and last, as hidden.storage)
    seed: int = 0
    # multi-latent attention (DeepSeek-V3's config keys): (q_lora_rank, kv_lora_rank,
    # qk_nope_head_dim, qk_rope_head_dim, v_head_dim); () is a Llama target. An MLA target
    # gets an MLA drafter (train.draft_attention auto)
    mla: tuple[int, ...] = ()


PRESETS = {
    "tiny": SyntheticSpec(),
    # Llama-3.1-8B shapes: what a real EAGLE-3 drafter trains at
    "llama8b": SyntheticSpec(4096, 14336, 32, 8, 128256, 32000, 32, 64, 2048, 4),
    # SmolLM2-135M shapes: the GPU example's drafter (config/examples/smollm2-sglang-h200.yaml)
    "smollm2": SyntheticSpec(576, 1536, 9, 3, 49152, 32000, 30, 256, 1024, 2),
    # Kimi-K2.5's text widths (DeepSeek-V3's: hidden 7168, dense MLP 18432, 64 heads, vocab
    # 163,840, 61 layers) at sequences of 4K: the drafter its users train (1,145M parameters)
    "kimi": SyntheticSpec(7168, 18432, 64, 64, 163840, 32000, 61, 32, 4096, 4),
    # the same with Kimi-K2.5's own multi-latent attention, the drafter `auto` now gives it
    "kimi_mla": SyntheticSpec(
        7168, 18432, 64, 64, 163840, 32000, 61, 32, 4096, 4, mla=(1536, 512, 128, 64, 128)
    ),
}


def target_config(s: SyntheticSpec) -> dict[str, object]:
    """The HF config.json of a Llama-family target of the spec's shapes (with `mla`, the
    same plus DeepSeek-V3's attention keys)."""
    H = s.hidden_size
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": s.intermediate_size,
        "num_attention_heads": s.num_attention_heads,
        "num_key_value_heads": s.num_key_value_heads,
        "head_dim": H // s.num_attention_heads,
        "num_hidden_layers": s.num_hidden_layers,
        "vocab_size": s.vocab_size,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    }
    if s.mla:
        config |= {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
        config |= dict(zip(MLA_KEYS, s.mla, strict=True))
    return config


def workspace_paths(out: str | Path, spec: SyntheticSpec = SyntheticSpec()) -> dict[str, object]:
    """The paths `train_drafter` takes, of the workspace `make_workspace` writes in `out`."""
    out, L = Path(out), spec.num_hidden_layers
    return {
        "shards": [
            str(out / "hidden" / "synthetic" / f"{k:05d}.safetensors") for k in range(spec.shards)
        ],
        "vocab": str(out / "vocab" / "vocab.safetensors"),
        "target_fingerprint": str(out / "target" / "fingerprint.json"),
        "layer_ids": default_layer_ids(L),
    }


def train_outputs(out: str | Path) -> dict[str, str]:
    """The outputs `train_drafter` writes, in the folder `out`."""
    out = Path(out)
    return {
        "best_out": str(out / "best.safetensors"),
        "metrics_out": str(out / "metrics.jsonl"),
        "state_dir": str(out / "state"),
    }


def make_workspace(out: str | Path, spec: SyntheticSpec = SyntheticSpec()) -> dict[str, object]:
    """Write the workspace; return the paths `train_drafter` takes."""
    out, s, paths = Path(out), spec, workspace_paths(out, spec)
    g = torch.Generator().manual_seed(s.seed)
    H, V, Vd = s.hidden_size, s.vocab_size, s.draft_vocab_size
    target = out / "target"
    target.mkdir(parents=True, exist_ok=True)
    config = target_config(s)
    write_json(target / "config.json", config)
    head = torch.randn(V, H, generator=g)  # unit-ish rows: lm_head(row j) peaks at j
    embed = torch.randn(V, H, generator=g) * 0.02
    with atomic_path(target / "model.safetensors") as path:
        save_tensors(
            {
                "lm_head.weight": head.bfloat16(),
                "model.embed_tokens.weight": embed.bfloat16(),
                "model.norm.weight": torch.ones(H).bfloat16(),
            },
            str(path),
        )
    fingerprint = f"synthetic-{s.seed}-{H}-{V}"
    write_json(
        target / "fingerprint.json",
        {
            "name": "synthetic",
            "source": "synthetic",
            "fingerprint": fingerprint,
            "weights_sha256": "",
            "tokenizer_fingerprint": "synthetic",
            "chat_template_sha256": "",
            "num_hidden_layers": s.num_hidden_layers,
            "hidden_size": H,
            "vocab_size": V,
            "model_type": config["model_type"],
        },
    )
    # Draft vocab = every other target id (so d2t is not all zeros).
    draft_ids = torch.arange(Vd) * (V // Vd)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft_ids] = True
    with atomic_path(paths["vocab"]) as path:
        save_tensors({"d2t": draft_ids - torch.arange(Vd), "t2d": t2d}, str(path))
    perm = draft_ids[torch.randperm(Vd, generator=g)]  # next-token table over draft ids
    nxt = torch.zeros(V, dtype=torch.int64)
    nxt[draft_ids] = perm
    per_shard = -(-s.samples // s.shards)
    for k in range(s.shards):
        n = min(per_shard, s.samples - k * per_shard)
        ids = torch.empty(n, s.seq_len, dtype=torch.int64)
        ids[:, 0] = draft_ids[torch.randint(Vd, (n,), generator=g)]
        for t in range(1, s.seq_len):
            ids[:, t] = nxt[ids[:, t - 1]]
        flat = ids.reshape(-1)
        last = head[nxt[flat]] * 0.5 + 0.1 * torch.randn(flat.shape[0], H, generator=g)
        aux = torch.cat([embed[flat] * 50, last * 0.5, last], -1)
        aux = aux + 0.1 * torch.randn(aux.shape, generator=g)
        mask = torch.zeros(n, s.seq_len, dtype=torch.uint8)
        mask[:, s.seq_len // 3 :] = 1  # the last two thirds are the "response"
        tensors = {
            "input_ids": flat.int(),
            "loss_mask": mask.reshape(-1),
            "offsets": torch.arange(n + 1, dtype=torch.int64) * s.seq_len,
        }
        if s.aux_dtype == "fp8":
            tensors["aux"], tensors["aux_scale"] = quantize_fp8(aux, 3)
            tensors["last"], tensors["last_scale"] = quantize_fp8(last, 1)
        else:
            tensors["aux"], tensors["last"] = aux.bfloat16(), last.bfloat16()
        meta = {
            "layer_ids": json.dumps(paths["layer_ids"]),
            "eagle_layer_ids": json.dumps(paths["layer_ids"]),  # a Llama target: the same
            "backend": "synthetic",
            "target_fingerprint": fingerprint,
            "tokenizer_fingerprint": "synthetic",
            "dtype": s.aux_dtype,
            "specbuild_version": "0",
        }
        write_shard(Path(paths["shards"][k]), tensors, meta)
    return paths


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--token-budget", type=int, default=8192)
    ap.add_argument("--profile", action="store_true", help="profile steps, no result.json")
    ap.add_argument("--spec-only", action="store_true", help="reuse the workspace in OUT")
    ap.add_argument(
        "--attention", choices=["auto", *ATTENTION], default="auto", help="train.attention"
    )
    ap.add_argument("--loss", choices=["auto", *LOSS], default="auto", help="train.loss")
    args = ap.parse_args(argv)
    out, preset = Path(args.out), PRESETS[args.preset]
    if args.spec_only:
        paths = workspace_paths(out, preset)
        config = out / "target" / "config.json"
        missing = [p for p in [*paths["shards"], paths["vocab"], config] if not Path(p).exists()]
        if missing or json.loads(config.read_text()) != target_config(preset):
            raise SystemExit(
                f"--spec-only: {out} holds no {args.preset} workspace "
                f"({'missing ' + ', '.join(map(str, missing)) if missing else 'other shapes'}); "
                "run once without --spec-only"
            )
    else:
        paths = make_workspace(out, preset)
    outputs = {"profile_out": str(out / "profile.json")} if args.profile else {}
    outputs = outputs or {"bench_out": str(out / "result.json")}
    spec = {
        "files": {
            "shards": paths["shards"],
            "vocab": paths["vocab"],
            "target_fingerprint": paths["target_fingerprint"],
            "best_out": str(out / "train" / "best.safetensors"),
            "metrics_out": str(out / "train" / "metrics.jsonl"),
            "state_dir": str(out / "train" / "state"),
        },
        "log_path": str(out / "train" / "train.log"),
        **outputs,
        "config": {
            "epochs": args.epochs,
            "token_budget": args.token_budget,
            "max_length": min(args.token_budget, preset.seq_len),
            "nproc": args.nproc,
            "eval_fraction": 0.1,
            "log_interval": 5,
            "save_interval": 10_000,
            "attention": args.attention,
            "loss": args.loss,
        },
    }
    write_json(out / "spec.json", spec)
    print(json.dumps(asdict(preset)), "->", out / "spec.json")


if __name__ == "__main__":
    main()
