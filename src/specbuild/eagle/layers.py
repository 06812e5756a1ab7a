"""EAGLE-3 layer ids in the two conventions that meet at serving time.

specbuild's `layer_ids` are layer-output ids: id `i` is the output of decoder layer `i`, HF's
`hidden_states[i + 1]`; shards, training and align speak only these. A served drafter's
`eagle_config.eagle_aux_hidden_state_layer_ids` is what SGLang hands its target model's
`set_eagle3_layers_to_capture`, which turns it into `layers_to_capture`: the decoder layers
whose *input* is captured (input of layer `c` = output of layer `c - 1`). SGLang 0.5.17's models
do not agree on that step:

- most (Llama, Qwen, GLM-4-MoE, ...) always add one: capture `[e + 1 for e in ids]`;
- the DeepSeek-V2 family (DeepSeek-V2/V3/V3.2, Kimi-K2.5 through its DeepSeek-V3 text model,
  Mistral-Large-3, GLM-4-MoE-Lite, GLM-MoE-DSA) adds one only when the first id is 1, and
  otherwise captures the ids as given;
- gpt-oss adds one unless the largest id equals the layer count.

So the eagle ids written at export are the ones that make SGLang capture exactly the layers
the shards hold, chosen per architecture; the hidden stage's SGLang runner checks the choice
against the model it loaded (its `layers_to_capture`) and records it in every shard. A layer
set no eagle ids can reach (the DeepSeek family and a first layer-output id of 0) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "AUX_LAYERS",
    "SHIFT_IF_FIRST_IS_ONE",
    "architecture_of",
    "candidate_eagle_ids",
    "default_layer_ids",
    "capture_indices",
    "capture_layers",
    "eagle_layer_ids",
    "output_layer_ids",
]

AUX_LAYERS = 3  # EAGLE-3 fuses the low, mid and high layer outputs of the target

# SGLang 0.5.17 classes whose set_eagle3_layers_to_capture shifts only when ids[0] == 1
# (deepseek_v2.py, glm4_moe_lite.py; Kimi-K2.5 delegates to its DeepSeek-V3 text model).
SHIFT_IF_FIRST_IS_ONE = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "MistralLarge3ForCausalLM",
        "GlmMoeDsaForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "KimiK25ForConditionalGeneration",
    }
)
# gpt_oss.py: ids whose largest equals the layer count are taken as capture indices already.
SHIFT_UNLESS_LAST_IS_DEPTH = frozenset({"GptOssForCausalLM"})


def architecture_of(config: Mapping[str, Any]) -> str:
    """The class SGLang instantiates for a target's config.json (the wrapper's, if any)."""
    archs = config.get("architectures") or []
    return str(archs[0]) if archs else ""


def default_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high layer-output ids for a target with `num_layers` layers (SGLang's
    own default when a drafter's config names none)."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def capture_indices(layer_ids: Sequence[int]) -> list[int]:
    """SGLang layer indices whose *input* is layer-output id `i` (HF hidden_states[i + 1])."""
    return [int(i) + 1 for i in layer_ids]


def candidate_eagle_ids(layer_ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """The two eagle_config conventions for `layer_ids`: as given, and shifted by one."""
    return [int(i) for i in layer_ids], capture_indices(layer_ids)


def capture_layers(architecture: str, eagle_ids: Sequence[int], num_layers: int) -> list[int]:
    """SGLang's `layers_to_capture` for a drafter whose eagle_config holds `eagle_ids`."""
    ids = [int(i) for i in eagle_ids]
    if architecture in SHIFT_IF_FIRST_IS_ONE and not (ids and ids[0] == 1):
        return ids
    if architecture in SHIFT_UNLESS_LAST_IS_DEPTH and ids and max(ids) == num_layers:
        return ids
    return [i + 1 for i in ids]


def output_layer_ids(architecture: str, eagle_ids: Sequence[int], num_layers: int) -> list[int]:
    """The layer-output ids SGLang feeds a drafter whose eagle_config holds `eagle_ids`."""
    return [c - 1 for c in capture_layers(architecture, eagle_ids, num_layers)]


def eagle_layer_ids(architecture: str, layer_ids: Sequence[int], num_layers: int) -> list[int]:
    """The eagle_config ids that make SGLang capture the outputs of `layer_ids`; ValueError
    naming the rule when none can."""
    want = capture_indices(layer_ids)
    for candidate in candidate_eagle_ids(layer_ids):
        if capture_layers(architecture, candidate, num_layers) == want:
            return candidate
    raise ValueError(
        f"hidden.layer_ids {list(layer_ids)}: SGLang's {architecture} shifts EAGLE-3 layer ids "
        f"by one only when the first id is 1, so no eagle_config can make it capture the output "
        f"of layer {layer_ids[0]}; choose a first layer-output id of 1 or more"
    )
