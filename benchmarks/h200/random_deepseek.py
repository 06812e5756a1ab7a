"""Write a random-weight DeepSeek-V3-architecture target folder at Kimi-K2.5's text widths.

Kimi-K2.5 (DeepSeek-V3's MoE + MLA text model inside a multimodal wrapper)
ships no weights a test machine can hold, so its architecture is built here with random
weights under DeepSeek's checkpoint names and SmolLM2's tokenizer, for SGLang to load as it
loads the real one:

    hidden 7168, 64 heads, q_lora 1536, kv_lora 512, rope/nope/v head dims 64/128/128,
    dense intermediate 18432 (the first layer), MoE intermediate 2048, routed experts with
    one shared expert, sigmoid scoring with a correction bias (noaux_tc), 8 layers by default

    python benchmarks/h200/random_deepseek.py /tmp/dsv3 --tokenizer /tmp/smol
    python benchmarks/h200/random_deepseek.py /tmp/kimi --tokenizer /tmp/smol --wrapper

`--wrapper` writes the same text model as Kimi-K2.5 lays it out: config.json of
`KimiK25ForConditionalGeneration` with the DeepSeek-V3 config in `text_config` and Kimi-K2.5's
`vision_config`, tensors under `language_model.` and no vision weights, and a processor as
remote code (processing_kimi_random.py: SGLang's server loads one for every Kimi-K2.5 target),
so the folder needs target.trust_remote_code as Kimi-K2.5's own does. Weights are drawn on the
GPU when there is one (seeded normal(0, 0.02), unit norms) and written as safetensors shards of
at most 4 GiB.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from specbuild.infra.safetensors_file import save_tensors

SHARD_BYTES = 4 << 30
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
PROCESSOR_CODE = Path(__file__).with_name("processing_kimi_random.py")


# narrower widths for tests on the device (gpu-marked): MLA's own dims kept, the rest cut
TEST_WIDTHS = {
    "hidden_size": 2048,
    "intermediate_size": 4096,
    "moe_intermediate_size": 512,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
}


def text_config(layers: int, experts: int, per_token: int, vocab: int, **widths: int) -> dict:
    """The DeepSeek-V3 config.json at Kimi-K2.5's widths, or with `widths` overridden."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": layers,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "n_shared_experts": 1,
        "n_routed_experts": experts,
        "num_experts_per_tok": per_token,
        "routed_scaling_factor": 2.827,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "num_nextn_predict_layers": 0,
        "hidden_act": "silu",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "rope_theta": 50000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    } | widths


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """{DeepSeek-V3 checkpoint name: shape} of the text model."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    heads, q_lora, kv_lora = cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vdim = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_a_proj.weight": (q_lora, h),
            p + "self_attn.q_a_layernorm.weight": (q_lora,),
            p + "self_attn.q_b_proj.weight": (heads * (nope + rope), q_lora),
            p + "self_attn.kv_a_proj_with_mqa.weight": (kv_lora + rope, h),
            p + "self_attn.kv_a_layernorm.weight": (kv_lora,),
            p + "self_attn.kv_b_proj.weight": (heads * (nope + vdim), kv_lora),
            p + "self_attn.o_proj.weight": (h, heads * vdim),
        }
        if i < cfg["first_k_dense_replace"]:
            mlps = {p + "mlp.": cfg["intermediate_size"]}
        else:
            e, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
            shapes |= {p + "mlp.gate.weight": (e, h), p + "mlp.gate.e_score_correction_bias": (e,)}
            mlps = {p + f"mlp.experts.{j}.": inter for j in range(e)}
            mlps[p + "mlp.shared_experts."] = inter * cfg["n_shared_experts"]
        for m, inter in mlps.items():
            shapes |= {
                m + "gate_proj.weight": (inter, h),
                m + "up_proj.weight": (inter, h),
                m + "down_proj.weight": (h, inter),
            }
    shapes |= {"model.norm.weight": (h,), "lm_head.weight": (v, h)}
    return shapes


def draw(name: str, shape: tuple[int, ...], g: torch.Generator, device: str) -> torch.Tensor:
    if name.endswith("e_score_correction_bias"):
        return torch.zeros(shape, dtype=torch.float32)  # DeepSeek keeps it in float32
    if len(shape) == 1:
        return torch.ones(shape, dtype=torch.bfloat16)  # norms
    w = torch.empty(shape, dtype=torch.bfloat16, device=device).normal_(0.0, 0.02, generator=g)
    return w.cpu()


def write(
    out: Path, cfg: dict, config: dict, prefix_map: dict[str, str], device: str, seed: int
) -> tuple[int, int]:
    """Weights of `cfg` (names moved by `prefix_map`), index and `config` into `out`; returns
    (bytes, parameters)."""
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device=device).manual_seed(seed)
    shapes = tensor_shapes(cfg)
    files, weight_map, shard, size = [], {}, {}, 0

    def flush() -> None:
        nonlocal shard, size
        if shard:
            files.append(shard)
        shard, size = {}, 0

    for name, shape in shapes.items():
        for old, new in prefix_map.items():
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        t = draw(name, shape, g, device)
        if size and size + t.numel() * t.element_size() > SHARD_BYTES:
            flush()
        shard[name] = t
        size += t.numel() * t.element_size()
    flush()
    total = 0
    for k, tensors in enumerate(files, 1):
        fname = f"model-{k:05d}-of-{len(files):05d}.safetensors"
        save_tensors(tensors, str(out / fname), metadata={"format": "pt"})
        for name, t in tensors.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return total, sum(t.numel() for f in files for t in f.values())


def write_target(
    out: Path,
    tokenizer: Path,
    *,
    layers: int = 8,
    experts: int = 8,
    per_token: int = 2,
    wrapper: bool = False,
    seed: int = 0,
    **widths: int,
) -> tuple[dict, int, int]:
    """The whole folder: weights, config.json (a Kimi-K2.5 wrapper's with `wrapper`) and the
    tokenizer of `tokenizer`; returns (config.json, bytes, parameters)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vocab = json.loads((tokenizer / "config.json").read_text())["vocab_size"]
    cfg = text_config(layers, experts, per_token, vocab, **widths)
    if wrapper:
        config = {
            "architectures": ["KimiK25ForConditionalGeneration"],
            "model_type": "kimi_k25",
            "text_config": cfg,
            "vision_config": vision_config(cfg["hidden_size"]),
            "torch_dtype": "bfloat16",
            "tie_word_embeddings": False,
        }
        prefixes = {"model.": "language_model.model.", "lm_head.": "language_model.lm_head."}
    else:
        config, prefixes = cfg, {}
    nbytes, params = write(out, cfg, config, prefixes, device, seed)
    for name in TOKENIZER_FILES + ("generation_config.json",):
        if (tokenizer / name).exists():
            shutil.copy2(tokenizer / name, out / name)
    if wrapper:
        write_processor(out)
    return config, nbytes, params


def vision_config(text_hidden: int) -> dict:
    """Kimi-K2.5's vision_config (MoonViT and its projector, SGLang builds both from it):
    its own keys, the projector's output at the text model's width."""
    return {
        "patch_size": 14,
        "init_pos_emb_height": 64,
        "init_pos_emb_width": 64,
        "init_pos_emb_time": 4,
        "pos_emb_type": "divided_fixed",
        "vt_num_attention_heads": 16,
        "vt_num_hidden_layers": 27,
        "vt_hidden_size": 1152,
        "vt_intermediate_size": 4304,
        "merge_kernel_size": [2, 2],
        "video_attn_type": "spatial_temporal",
        "merge_type": "sd2_tpool",
        "mm_projector_type": "patchmerger",
        "mm_hidden_size": 1152,
        "projector_hidden_act": "gelu",
        "projector_ln_eps": 1e-5,
        "text_hidden_size": text_hidden,
    }


def write_processor(out: Path) -> None:
    """The folder's processor as remote code (processing_kimi_random.py beside this script):
    SGLang's server loads one for every Kimi-K2.5 target, so the folder needs
    target.trust_remote_code as Kimi-K2.5's own does."""
    shutil.copy2(PROCESSOR_CODE, out / PROCESSOR_CODE.name)
    module = f"{PROCESSOR_CODE.stem}.KimiRandom"
    auto = {"AutoProcessor": module + "Processor", "AutoImageProcessor": module + "ImageProcessor"}
    preprocessor = {"image_processor_type": "KimiRandomImageProcessor", "auto_map": auto}
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=1))
    processor = {"processor_class": "KimiRandomProcessor", "auto_map": auto}
    (out / "processor_config.json").write_text(json.dumps(processor, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True, help="folder of tokenizer files")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=8, help="routed experts per MoE layer")
    ap.add_argument("--experts-per-token", type=int, default=2)
    ap.add_argument("--wrapper", action="store_true", help="Kimi-K2.5's multimodal layout")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    start = time.perf_counter()
    config, nbytes, params = write_target(
        args.out,
        args.tokenizer,
        layers=args.layers,
        experts=args.experts,
        per_token=args.experts_per_token,
        wrapper=args.wrapper,
        seed=args.seed,
    )
    print(
        f"{args.out}: {config['architectures'][0]}, {params / 1e9:.2f}B parameters, "
        f"{nbytes / 1e9:.1f} GB in {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
