"""The chain type: a drafting shape parsed from its name, rendered as SGLang's flags, refused
naming the fault, and shown baseline first."""

from __future__ import annotations

import pytest

from specbuild.eagle.chain import BASELINE, Chain, chain_order, simulated_acceptance_length


def test_a_chain_parses_and_renders_sglangs_flags(tmp_path):
    chain = Chain.parse("7-1-8")
    assert (chain.steps, chain.topk, chain.draft_tokens, chain.name) == (7, 1, 8, "7-1-8")
    assert chain.server_args(str(tmp_path)) == {
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": str(tmp_path),
        "speculative_num_steps": 7,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 8,
    }
    assert Chain.parse("3-4-8").is_chain is False  # a tree: SGLang only
    # the draft's attention backend only where one is named (sglang.draft_attention_backend)
    named = chain.server_args(str(tmp_path), draft_attention_backend="triton")
    assert named["speculative_draft_attention_backend"] == "triton"


@pytest.mark.parametrize(
    ("name", "match"),
    [("3-1-5", "steps \\+ 1 = 4"), ("0-1-1", "steps must be >= 1"), ("3x1", "expected")],
)
def test_a_bad_chain_is_refused_naming_the_fault(name, match):
    with pytest.raises(ValueError, match=match):
        Chain.parse(name)


def test_chains_are_shown_baseline_first_then_by_size():
    assert chain_order(["7-1-8", BASELINE, "3-1-4", "3-4-8"]) == [
        BASELINE,
        "3-1-4",
        "3-4-8",
        "7-1-8",
    ]


def test_simulated_acceptance_length_counts_the_bonus_token():
    assert simulated_acceptance_length([1.0, 1.0]) == 3.0
    assert simulated_acceptance_length([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert simulated_acceptance_length([]) == 1.0
