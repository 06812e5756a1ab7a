"""Write Kimi-K2.5's folder layout around SmolLM2's text model, for the CPU tests.

What a Kimi-K2.5 user's folder has and a plain Llama folder does not:
- config.json of `KimiK25ForConditionalGeneration`: the text model's config in `text_config`,
  and `auto_map` naming a config class in the folder's own `configuration_kimi_layout.py`;
- tensors under `language_model.` (`language_model.model.embed_tokens.weight`,
  `language_model.lm_head.weight`), sharded with an index, beside vision tensors the text
  stages must leave alone;
- a tokenizer class of its own (`tokenization_kimi_layout.py` behind `auto_map`) that reads
  `tiktoken.model`, so a folder linked without its tokenizer files fails to load;
- a chat template of its own (`<|im_user|>`, `<|im_assistant|>`), which shows an assistant
  turn's reasoning in `<think>` only after the last user turn (earlier ones get an empty one).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

ARCHITECTURE = "KimiK25ForConditionalGeneration"
VISION_TENSOR = "vision_tower.patch_embed.proj.weight"

CONFIG_CODE = '''"""The Kimi-layout test folder's config: the text model in text_config."""

from transformers import PretrainedConfig


class KimiLayoutConfig(PretrainedConfig):
    model_type = "kimi_k25"

    def __init__(self, text_config=None, vision_config=None, **kwargs):
        self.text_config = text_config or {}
        self.vision_config = vision_config or {}
        super().__init__(**kwargs)
'''

TOKENIZER_CODE = '''"""The Kimi-layout test folder's tokenizer: it needs its tiktoken.model."""

import os

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast


class KimiLayoutTokenizer(PreTrainedTokenizerFast):
    vocab_files_names = {"vocab_file": "tiktoken.model", "tokenizer_file": "tokenizer.json"}

    def __init__(self, vocab_file=None, **kwargs):
        if vocab_file is None or not os.path.isfile(vocab_file):
            raise FileNotFoundError(f"tiktoken.model not found ({vocab_file!r})")
        self.vocab_file = vocab_file
        # the vocabulary and merges as tokenizers serialized them, beside tiktoken.model
        for extracted in ("vocab", "merges", "tokenizer_file"):
            kwargs.pop(extracted, None)
        path = os.path.join(os.path.dirname(vocab_file), "tokenizer.json")
        kwargs["tokenizer_object"] = Tokenizer.from_file(path)
        super().__init__(vocab_file=vocab_file, **kwargs)
'''

# Kimi's turn markers, and its handling of reasoning: an assistant turn before the last user
# turn is shown with an empty <think></think>, its reasoning dropped; later turns keep theirs.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}"
    "{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}<|im_system|>system<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- elif m['role'] == 'user' -%}<|im_user|>user<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- else -%}<|im_assistant|>assistant<|im_middle|><think>"
    "{%- if loop.index0 > ns.last_user -%}{{ m.get('reasoning_content') or '' }}{%- endif -%}"
    "</think>{{ m['content'] }}<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def write_kimi_layout(smol: Path, out: Path) -> Path:
    """SmolLM2's materialized folder `smol` rewritten in Kimi-K2.5's layout under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    smol_config = json.loads((smol / "config.json").read_text())
    text = {**smol_config, "tie_word_embeddings": False}  # Kimi's head is a tensor of its own
    text.pop("architectures", None)
    config = {
        "architectures": [ARCHITECTURE],
        "model_type": "kimi_k25",
        "auto_map": {"AutoConfig": "configuration_kimi_layout.KimiLayoutConfig"},
        "text_config": text,
        "vision_config": {"patch_size": 14},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "configuration_kimi_layout.py").write_text(CONFIG_CODE)
    (out / "tokenization_kimi_layout.py").write_text(TOKENIZER_CODE)

    with safe_open(str(smol / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    renamed = {"language_model." + k: v for k, v in tensors.items()}
    renamed["language_model.lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    layers = {k: v for k, v in renamed.items() if ".layers." in k}
    rest = {k: v for k, v in renamed.items() if k not in layers}
    rest[VISION_TENSOR] = torch.zeros(8, 3, 14, 14, dtype=next(iter(tensors.values())).dtype)
    files = {"model-00001-of-00002.safetensors": layers, "model-00002-of-00002.safetensors": rest}
    weight_map = {}
    for name, part in files.items():
        save_file(part, str(out / name), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, name)
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))

    tokenizer = json.loads((smol / "tokenizer.json").read_text())
    special = ["<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>"]
    vocab = tokenizer["model"]["vocab"]
    # Kimi's specials are tokens of its vocabulary: reuse four of SmolLM2's reserved ids
    # (its <|im_start|> family) so the vocabulary size stays the text model's
    added = {a["content"]: a for a in tokenizer["added_tokens"]}
    reused = ["<|im_start|>", "<repo_name>", "<reponame>", "<file_sep>"]
    for new, old in zip(special, reused, strict=True):
        entry = added.get(old)
        if entry is None:
            raise ValueError(f"{smol}/tokenizer.json: no added token {old!r} to reuse")
        entry["content"] = new
        vocab[new] = vocab.pop(old, entry["id"])
    im_end = "<|im_end|>"
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    ranks = sorted(vocab.items(), key=lambda kv: kv[1])
    (out / "tiktoken.model").write_text(
        "".join(f"{base64.b64encode(t.encode()).decode()} {i}\n" for t, i in ranks)
    )
    tok_config = {
        "tokenizer_class": "KimiLayoutTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi_layout.KimiLayoutTokenizer", None]},
        "bos_token": "<|endoftext|>",
        "eos_token": im_end,
        "pad_token": im_end,
        "model_max_length": 8192,
        "additional_special_tokens": special,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    generation = {"eos_token_id": vocab.get(im_end, added[im_end]["id"])}
    (out / "generation_config.json").write_text(json.dumps(generation))
    return out
