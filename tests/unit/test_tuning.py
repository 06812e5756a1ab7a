"""Server tuning points: NCCL environment checks, flags the server overrode, and whole points
(rejected, failed to start, measured) against the loopback stub (a real subprocess on
127.0.0.1). Timings are never asserted."""

from __future__ import annotations

import json
import logging

import pytest
from bench_cases import LAUNCHER, MT_BENCH

from specbuild.engines.server import ServerOptions
from specbuild.infra.io import read_json
from specbuild.tuning import (
    TUNING_KEYS,
    TuningPoint,
    TuningSettings,
    env_faults,
    ignored_flags,
    plan_tuning_point,
    run_tuning_point,
)


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


HELP = "usage: launch_server [--model-path PATH] [--tp-size N] [--cuda-graph-max-bs N]"


def test_a_points_plan_runs_the_shared_flags_then_its_own_then_its_chains():
    server = ServerOptions(launcher=LAUNCHER, server_args={"tp_size": 1, "cuda_graph_max_bs": 4})
    point = TuningPoint("graphs", {"cuda_graph_max_bs": 8}, {"NCCL_PROTO": "LL"})
    plan = plan_tuning_point(point, server=server, target_dir="/models/t", help_text=HELP)
    assert plan.faults == ()
    assert plan.args == {"tp_size": 1, "cuda_graph_max_bs": 8}
    assert plan.spec.env["NCCL_PROTO"] == "LL" and plan.spec.model_path == "/models/t"
    chained = plan_tuning_point(
        point,
        server=server,
        target_dir="/models/t",
        help_text=HELP,
        chain="3-1-4",
        drafter_dir="/drafters/d",
    )
    assert chained.args["speculative_algorithm"] == "EAGLE3"
    assert chained.args["speculative_draft_model_path"] == "/drafters/d"


def test_a_points_plan_lists_unknown_flags_first_then_bad_env_values():
    point = TuningPoint("typo", {"cuda_graph_max_bz": 8}, {"NCCL_PROTO": "LL256"})
    plan = plan_tuning_point(
        point, server=ServerOptions(launcher=LAUNCHER), target_dir="/models/t", help_text=HELP
    )
    assert len(plan.faults) == 2
    assert plan.faults[0].startswith("unknown flag(s) --cuda-graph-max-bz")
    assert plan.faults[1].startswith("NCCL_PROTO=LL256")


@pytest.fixture(scope="module")
def stub_help() -> str:
    from specbuild.engines.server import launcher_help

    return launcher_help(LAUNCHER)


def _point(tmp_path, target_dir, help_text, name, args=None, env=None, share_idle_s=0.0):
    server = ServerOptions(
        launcher=LAUNCHER, server_args={"disable_radix_cache": True}, startup_timeout_s=20
    )
    return run_tuning_point(
        target_dir=target_dir,
        point=TuningPoint(name, args or {}, env or {}),
        server=server,
        out=tmp_path / f"{name}.json",
        help_text=help_text,
        settings=TuningSettings(
            prompt_set=MT_BENCH,
            prompts=2,
            max_new_tokens=8,
            concurrency=[1, 2],
            sweep_min_requests=2,
        ),
        share_idle_s=share_idle_s,
    )


def test_tuning_point_with_an_unknown_flag_is_rejected_and_never_started(
    tmp_path, target_dir, stub_help
):
    row = _point(tmp_path, target_dir, stub_help, "typo", args={"cuda_graph_max_bz": 8})
    assert row["status"] == "rejected" and list(row) == list(TUNING_KEYS)
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
    assert "--config " in caplog.text and "NCCL_PROTO=LL" in caplog.text
    assert row["single_stream_tokens_per_s"] > 0 and row["peak_concurrency"] in (1, 2)
    assert row["accept_length"] == 1.0 and row["itl_s_p99"] >= row["itl_s_p50"] > 0
    assert row["server_start_s"] > 0  # what the start cost, beside what it measured
    assert "NCCL_PROTO has no effect at tp_size 1" in row["notes"]
    assert json.loads(row["env"]) == {"NCCL_PROTO": "LL"}


def test_points_with_the_same_flags_measure_on_one_shared_server(
    tmp_path, target_dir, stub_help, registry
):
    one = _point(tmp_path, target_dir, stub_help, "one", share_idle_s=30.0)
    two = _point(tmp_path, target_dir, stub_help, "two", share_idle_s=30.0)
    assert one["status"] == two["status"] == "ok", (one["detail"], two["detail"])
    (folder,) = registry.iterdir()  # one keeper: one server for both points
    assert (folder / "keeper.log").read_text().count("starting sglang-shared-") == 1
    assert one["server_start_s"] == two["server_start_s"] > 0  # the one start's cost
    assert "shared server" in two["notes"] and two["single_stream_tokens_per_s"] > 0
