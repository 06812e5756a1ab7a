"""Serving bench and tuning sweep against the loopback stub (a real subprocess on 127.0.0.1).

The stub commits SGLANG_STUB_ACCEPT tokens per verify step with a drafter loaded, so the
acceptance numbers here are known in advance; timings are never asserted."""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

import pytest

from specbuild.backends.server import ServerSpec, SGLangServer
from specbuild.bench.server import (
    SGLangBenchBackend,
    spec_server_args,
    stream_completion,
    summarize_rows,
    write_server_bench_outputs,
)
from specbuild.bench.specdec import ROW_KEYS, check_rows
from specbuild.bench.tuning import (
    TUNING_KEYS,
    env_faults,
    ignored_flags,
    run_tuning_point,
    write_tuning_outputs,
)
from specbuild.io import read_json, read_jsonl

STUB = Path(__file__).resolve().parents[1] / "stubs" / "sglang_stub.py"
LAUNCHER = (sys.executable, str(STUB))
REPO = Path(__file__).resolve().parents[2]
MT_BENCH = {
    "path": str(REPO / "resources/bench/mt_bench.jsonl"),
    "format": "turns",
    "id_key": "question_id",
}


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, target_dir, random_drafter) -> Path:
    cfg = json.loads((target_dir / "config.json").read_text())
    return random_drafter(tmp_path_factory.mktemp("drafter"), cfg, [1, 14, 26])


def test_spec_server_args_for_a_chain_and_for_the_baseline(tmp_path):
    assert spec_server_args("baseline", None) == {}
    args = spec_server_args("7-1-8", str(tmp_path))
    assert args == {
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": str(tmp_path),
        "speculative_num_steps": 7,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 8,
    }


@pytest.mark.parametrize(
    ("chain", "drafter_dir", "match"),
    [("3-1-4", None, "needs a drafter"), ("3-1-5", "d", "steps \\+ 1"), ("3x1", "d", "expected")],
)
def test_spec_server_args_rejects_bad_chains(chain, drafter_dir, match):
    with pytest.raises(ValueError, match=match):
        spec_server_args(chain, drafter_dir)


def test_chain_rows_use_spec_verify_ct_and_follow_the_specdec_schema(target_dir, drafter):
    args = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(drafter)]
    spec = ServerSpec(
        model_path=str(target_dir),
        launcher=LAUNCHER,
        server_args=tuple(args),
        env={"SGLANG_STUB_ACCEPT": "3"},
        startup_timeout_s=20,
    )
    with SGLangServer(spec) as srv:
        engine = SGLangBenchBackend(base_url=srv.base_url, config="3-1-4", drafter="ours")
        c = engine.complete([10, 20, 30], max_new_tokens=13)
        r = stream_completion(srv.base_url, [10, 20, 30], 13)
    n = len(c.token_ids)
    assert n == r.completion_tokens and c.ttft_s is not None and c.ttft_s <= c.wall_s
    assert c.verify_steps == math.ceil((n - 1) / 3)  # the stub commits 3 tokens per verify
    from specbuild.bench.specdec import make_row

    row = make_row(c, set_name="s", prompt_id="p", turn=1, backend=engine)
    check_rows([row])
    assert row["backend"] == "sglang" and row["accept_length"] == (n - 1) / c.verify_steps


def test_a_chain_server_without_a_drafter_fails_instead_of_scoring_one(target_dir):
    spec = ServerSpec(model_path=str(target_dir), launcher=LAUNCHER, startup_timeout_s=20)
    with SGLangServer(spec) as srv:
        engine = SGLangBenchBackend(base_url=srv.base_url, config="3-1-4", drafter="ours")
        with pytest.raises(RuntimeError, match="no spec_verify_ct"):
            engine.complete([1, 2, 3], 8)


def test_server_bench_writes_rows_sweep_and_summary_for_drafter_and_baseline(
    tmp_path, target_dir, drafter, caplog
):
    from specbuild.bench.server import run_server_bench

    sets = {"mt_bench": {**MT_BENCH, "limit": 2}}
    summaries, sweeps = [], []
    for chain in ("baseline", "3-1-4"):
        out = tmp_path / chain
        with caplog.at_level(logging.INFO, logger="specbuild"):
            summary = run_server_bench(
                target_dir=target_dir,
                config=chain,
                sets=sets,
                out_rows=f"{out}.jsonl",
                out_sweep=f"{out}.sweep.jsonl",
                out_summary=f"{out}.summary.json",
                drafter_dir=str(drafter) if chain != "baseline" else None,
                drafter_name="ours",
                launcher=LAUNCHER,
                server_args={"disable_radix_cache": True},
                startup_timeout_s=20,
                max_new_tokens=12,
                concurrency=[1, 3],
                sweep_min_requests=4,
            )
        # the server demanded a key (the stub answers 401 without it), and the bench sent it
        assert "--api-key ***" in caplog.text and "api_key='***'" in caplog.text
        rows = list(read_jsonl(f"{out}.jsonl"))
        assert len(rows) == 4  # 2 prompts x 2 turns
        assert set(ROW_KEYS) <= set(rows[0]) and rows[0]["ttft_s"] is not None
        sweep = list(read_jsonl(f"{out}.sweep.jsonl"))
        assert [(s["concurrency"], s["requests"]) for s in sweep] == [(1, 4), (3, 4)]
        summaries.append(f"{out}.summary.json")
        sweeps.append(f"{out}.sweep.jsonl")
        if chain == "baseline":
            assert summary["accept_length"] == 1.0 and rows[0]["drafter"] == "none"
            assert summary["accept_length_sglang"] is None  # no spec_verify_ct without drafter
        else:
            comp = sum(r["completion_tokens"] for r in rows)
            verify = sum(r["verify_steps"] for r in rows)
            assert summary["accept_length_sglang"] == comp / verify > 1.0
    table = write_server_bench_outputs(
        summaries,
        sweeps,
        csv_path=tmp_path / "t.csv",
        md_path=tmp_path / "t.md",
        sweep_csv_path=tmp_path / "s.csv",
        plot_path=tmp_path / "p.png",
    )
    assert [r["config"] for r in table] == ["baseline", "3-1-4"]
    assert table[0]["speedup"] == 1.0
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert "| baseline |" in (tmp_path / "t.md").read_text()


def test_summarize_rows_accept_lengths_match_both_conventions():
    rows = [
        {"completion_tokens": 9, "verify_steps": 4, "wall_s": 1.0, "config": "3-1-4"},
        {"completion_tokens": 5, "verify_steps": 2, "wall_s": 1.0, "config": "3-1-4"},
    ]
    s = summarize_rows(rows, [])
    assert s["accept_length"] == (14 - 2) / 6  # bonus token included, prefill token not
    assert s["accept_length_sglang"] == 14 / 6  # SGLang: Σ completion / Σ spec_verify_ct


# --- tuning ----------------------------------------------------------------------------------


def test_env_faults_name_bad_nccl_values_and_refuse_nvlink_multicast():
    ok = {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
        "NCCL_P2P_LEVEL": "SYS",
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_NTHREADS": "512",
    }
    assert env_faults(ok) == []
    faults = env_faults({"NCCL_PROTO": "LL256", "NCCL_NTHREADS": "100", "NCCL_NVLS_ENABLE": "1"})
    assert len(faults) == 3
    assert faults[0].startswith("NCCL_PROTO=LL256") and "multiple of 64" in faults[1]
    assert "NVLink multicast" in faults[2]


def test_ignored_flags_reports_values_the_server_overrode():
    info = {"attention_backend": "flashinfer", "cuda_graph_max_bs": 8, "tp_size": 1}
    asked = {"attention_backend": "triton", "cuda_graph_max_bs": 8, "not_reported": 1}
    assert ignored_flags(asked, info) == [
        "attention_backend: asked 'triton', server runs 'flashinfer'"
    ]


@pytest.fixture(scope="module")
def stub_help() -> str:
    from specbuild.backends.server import launcher_help

    return launcher_help(LAUNCHER)


def _point(tmp_path, target_dir, help_text, name, args=None, env=None):
    return run_tuning_point(
        target_dir=target_dir,
        point=name,
        point_args=args or {},
        point_env=env or {},
        base_args={"disable_radix_cache": True},
        base_env={},
        out=tmp_path / f"{name}.json",
        prompt_set=MT_BENCH,
        help_text=help_text,
        prompts=2,
        launcher=LAUNCHER,
        startup_timeout_s=20,
        max_new_tokens=8,
        concurrency=[1, 2],
        sweep_min_requests=2,
    )


def test_tuning_point_with_an_unknown_flag_is_rejected_and_never_started(
    tmp_path, target_dir, stub_help
):
    row = _point(tmp_path, target_dir, stub_help, "typo", args={"cuda_graph_max_bz": 8})
    assert row["status"] == "rejected"
    assert "--cuda-graph-max-bz" in row["detail"] and row["peak_output_tokens_per_s"] is None


def test_tuning_point_whose_server_dies_is_recorded_as_start_failed(
    tmp_path, target_dir, stub_help
):
    row = _point(tmp_path, target_dir, stub_help, "dies", env={"SGLANG_STUB_EXIT": "7"})
    assert row["status"] == "start_failed" and "code 7" in row["detail"]
    assert read_json(tmp_path / "dies.json") == row


def test_tuning_point_measures_and_notes_nccl_without_collectives(
    tmp_path, target_dir, stub_help, caplog
):
    with caplog.at_level(logging.INFO, logger="specbuild"):
        row = _point(
            tmp_path,
            target_dir,
            stub_help,
            "nccl",
            args={"cuda_graph_max_bs": 8},
            env={"NCCL_PROTO": "LL"},
        )
    assert row["status"] == "ok", row["detail"]
    # measured through a server that answers 401 without its key: the sweep sent it
    assert "--api-key ***" in caplog.text and "NCCL_PROTO=LL" in caplog.text
    assert row["single_stream_tokens_per_s"] > 0 and row["peak_concurrency"] in (1, 2)
    assert "NCCL_PROTO has no effect at tp_size 1" in row["notes"]
    assert json.loads(row["env"]) == {"NCCL_PROTO": "LL"}


def test_tuning_table_has_one_row_per_point_with_its_status(tmp_path, target_dir, stub_help):
    _point(tmp_path, target_dir, stub_help, "a")
    _point(tmp_path, target_dir, stub_help, "b", args={"bogus_flag": True})
    rows = write_tuning_outputs(
        [tmp_path / "a.json", tmp_path / "b.json"],
        csv_path=tmp_path / "t.csv",
        md_path=tmp_path / "t.md",
        plot_path=tmp_path / "t.png",
    )
    assert [(r["point"], r["status"]) for r in rows] == [("a", "ok"), ("b", "rejected")]
    header = (tmp_path / "t.csv").read_text().splitlines()[0]
    assert header.split(",") == list(TUNING_KEYS)
    assert (tmp_path / "t.png").stat().st_size > 1000
