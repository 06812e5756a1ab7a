"""SGLang's model runner in process, on CPU: the layer-id convention it captures by, the
decoder stack's output packing, its ServerArgs, the chunks its pools hold, and the TP worker
loop. The real runner needs a GPU: tests/unit/hidden/test_sglang.py's gpu-marked tests."""

from __future__ import annotations

import pytest
import torch

from specbuild.eagle.layers import capture_indices
from specbuild.engines.runner import (
    enable_aux_capture,
    pack_aux,
    plan_chunks,
    runner_server_args,
    stack_output,
    worker_loop,
)

LAYER_IDS = [1, 14, 26]  # SmolLM2-135M: 30 layers


# --- layer ids --------------------------------------------------------------------------------


class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers_to_capture = []


class _LlamaLike(torch.nn.Module):
    """SGLang's Llama convention: capture the input of layers id + 1."""

    def __init__(self):
        super().__init__()
        self.model = _Stack()

    def set_eagle3_layers_to_capture(self, layer_ids):
        self.capture_aux_hidden_states = True
        self.model.layers_to_capture = [i + 1 for i in layer_ids]


class DeepseekV3ForCausalLM(_LlamaLike):
    """SGLang 0.5.17's DeepSeek-V2/V3: shifts only when the first id is 1 (named as SGLang's
    class, whose name is the architecture specbuild reads the rule by)."""

    def set_eagle3_layers_to_capture(self, layer_ids):
        shift = 1 if layer_ids and layer_ids[0] == 1 else 0
        self.model.layers_to_capture = [i + shift for i in layer_ids]


class _Stubborn(_LlamaLike):
    """A model that captures one fixed set whatever it is asked."""

    def set_eagle3_layers_to_capture(self, layer_ids):
        self.model.layers_to_capture = [5, 6, 7]


def test_capture_indices_are_the_inputs_of_layers_id_plus_one():
    assert capture_indices(LAYER_IDS) == [2, 15, 27]


def test_aux_capture_is_turned_on_in_the_decoder_stack_at_id_plus_one():
    model = _LlamaLike()
    stack, eagle_ids = enable_aux_capture(model, LAYER_IDS, 30)
    assert stack is model.model and eagle_ids == LAYER_IDS
    assert model.model.layers_to_capture == [2, 15, 27] and model.capture_aux_hidden_states


def test_deepseek_captures_the_trained_layers_under_the_eagle_ids_its_rule_needs():
    model = DeepseekV3ForCausalLM()
    assert enable_aux_capture(model, [1, 30, 57], 61)[1] == [1, 30, 57]
    assert model.model.layers_to_capture == [2, 31, 58]
    # a first id other than 1 is not shifted: the ids shifted by hand reach the same layers
    assert enable_aux_capture(model, [2, 30, 57], 61)[1] == [3, 31, 58]
    assert model.model.layers_to_capture == [3, 31, 58]


def test_a_model_whose_rule_specbuild_misreads_is_still_matched_and_warned(caplog):
    class LlamaForCausalLM(DeepseekV3ForCausalLM):  # a Llama-named class with DeepSeek's rule
        pass

    assert enable_aux_capture(LlamaForCausalLM(), [2, 30, 57], 61)[1] == [3, 31, 58]
    assert "not for [2, 30, 57] as specbuild reads its rule" in caplog.text


def test_layers_no_eagle_ids_can_reach_are_refused_before_any_token_runs():
    with pytest.raises(RuntimeError, match=r"hidden.layer_ids \[0, 30, 57\].*first id is 1"):
        enable_aux_capture(DeepseekV3ForCausalLM(), [0, 30, 57], 61)
    with pytest.raises(RuntimeError, match=r"no decoder stack with \[2, 15, 27\].*\[5, 6, 7\]"):
        enable_aux_capture(_Stubborn(), LAYER_IDS, 30)


def test_a_model_without_eagle3_capture_is_refused_naming_it():
    with pytest.raises(RuntimeError, match="_Stack has no EAGLE-3 aux capture"):
        enable_aux_capture(_Stack(), LAYER_IDS, 30)


def test_aux_states_come_as_a_list_or_packed_and_shard_the_same():
    # Llama's decoder stack hands back [aux_low, aux_mid, aux_high]; DeepSeek's one [T, 3H]
    # (AuxHiddenStatePacker); with capture off both hand back the bare final state
    g = torch.Generator().manual_seed(0)
    last = torch.randn(7, 4, generator=g)
    parts = [torch.randn(7, 4, generator=g) for _ in range(3)]
    listed = stack_output((last, parts))
    packed = stack_output((last, torch.cat(parts, dim=-1)))
    assert torch.equal(listed[1], packed[1]) and listed[1].shape == (7, 12)
    assert listed[0] is last and packed[0] is last
    assert stack_output(last) == (last, None)
    assert pack_aux([]) is None and pack_aux(torch.empty(0)) is None


# --- server args and chunks --------------------------------------------------------------------


def test_runner_args_keep_the_users_flags_and_force_prefill_only_settings():
    args = runner_server_args(
        "/m",
        {"tp": 2, "attention_backend": "triton", "host": "0.0.0.0", "disable_cuda_graph": False},
        mem_fraction_static=0.6,
    )
    assert args["model_path"] == "/m" and args["tp_size"] == 2 and "tp" not in args
    assert args["attention_backend"] == "triton" and "host" not in args
    assert args["disable_cuda_graph"] is True and args["disable_radix_cache"] is True
    assert args["mem_fraction_static"] == 0.6 and args["max_running_requests"] == 1024


def test_chunks_fit_the_kv_pool_and_the_request_pool_in_order():
    chunks = plan_chunks([5, 5, 5, 3, 3, 3, 3], max_tokens=10, max_requests=3)
    assert [list(c) for c in chunks] == [[0, 1], [2, 3], [4, 5, 6]]
    assert [list(c) for c in plan_chunks([4] * 5, max_tokens=100, max_requests=2)] == [
        [0, 1],
        [2, 3],
        [4],
    ]


def test_a_sample_longer_than_the_kv_pool_is_refused_naming_the_keys_to_change():
    with pytest.raises(ValueError, match=r"sample 1 .* 11 tokens.*mem_fraction_static"):
        plan_chunks([3, 11], max_tokens=10, max_requests=8)


# --- tensor parallel: ranks > 0 run what rank 0 sends ----------------------------------------


def test_a_worker_rank_runs_every_broadcast_batch_in_order_and_stops_on_none():
    sent = [[[1, 2]], [[3], [4, 5]], None, [[9]]]
    ran = []
    assert worker_loop(lambda: sent.pop(0), ran.append) == 2
    assert ran == [[[1, 2]], [[3], [4, 5]]] and sent == [[[9]]]
