"""benchmarks/paired.py: a later drafter against a reference run's bench rows, request by
request."""

from __future__ import annotations

import json

from benchmarks.paired import paired_table


def _rows(path, drafter, verify, device="cuda (NVIDIA H200)", chain="3-1-4"):
    keys = ("set", "prompt_id", "turn", "phase", "concurrency", "engine", "device", "chain")
    with open(path, "w") as fh:
        for i, v in enumerate(verify):
            row = dict.fromkeys(keys) | {
                "set": "mt_bench",
                "prompt_id": str(i),
                "turn": 1,
                "phase": "bench",
                "concurrency": 1,
                "engine": "sglang",
                "device": device,
                "chain": chain,
                "drafter": drafter,
                "completion_tokens": 60,
                "verify_steps": v,
                "accept_length": 60 / v,
                "accepted_per_position": [],
                "start_s": 0.0,
                "wall_s": 1.0,
                "ttft_s": 0.1,
                "itl_s": 0.01,
                "tokens_per_s": 60.0,
            }
            fh.write(json.dumps(row) + "\n")


def test_a_later_drafter_is_paired_with_the_reference_of_the_same_name(tmp_path):
    _rows(tmp_path / "ref.jsonl", "base", [30] * 6)
    _rows(tmp_path / "new.jsonl", "tasks", [20] * 6, device="cuda (NVIDIA H100 80GB HBM3)")
    _rows(tmp_path / "again.jsonl", "base", [30] * 6)
    table = paired_table(
        str(tmp_path / "ref.jsonl"), [tmp_path / "new.jsonl", tmp_path / "again.jsonl"]
    )
    # both devices named: rows from another GPU model are not a repeat of the reference
    assert table.startswith("devices: cuda (NVIDIA H100 80GB HBM3), cuda (NVIDIA H200)\n")
    lines = [line for line in table.splitlines() if line.startswith("| mt_bench")]
    assert lines == [
        "| mt_bench | tasks | base (reference) | 6 | 3 | 2 | 1.5 | 1.5 | 1.5 |",
        "| mt_bench | base | base (reference) | 6 | 2 | 2 | 1 | 1 | 1 |",
    ]


def test_a_block_drafter_pairs_with_an_eagle_reference_at_another_chain_only_when_asked(tmp_path):
    _rows(tmp_path / "ref.jsonl", "base", [30] * 6)
    _rows(tmp_path / "new.jsonl", "dflash", [15] * 6, chain="7-1-8")
    ref, new = str(tmp_path / "ref.jsonl"), [tmp_path / "new.jsonl"]
    assert not [line for line in paired_table(ref, new).splitlines() if "| mt_bench" in line]
    table = paired_table(ref, new, across_chains=True)
    lines = [line for line in table.splitlines() if line.startswith("| mt_bench")]
    assert lines == ["| mt_bench | dflash | base (reference) @3-1-4 | 6 | 4 | 2 | 2 | 2 | 2 |"]
