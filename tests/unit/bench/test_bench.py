"""Bench stage: every metric on hand-checkable numbers, and the served engines (sglang, openai)
against the loopback stub (a real subprocess on 127.0.0.1). The stub commits SGLANG_STUB_ACCEPT
tokens per verify step with a drafter loaded, so acceptance numbers here are known in advance;
timings are never asserted. The PyTorch engine's losslessness: test_hf.py. The chain
type: eagle/test_chain.py; the tuning sweep: test_tuning.py."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from bench_cases import LAUNCHER, MT_BENCH

from specbuild.bench.metrics import (
    acceptance_interval,
    acceptance_length,
    inter_token_latency,
    latency_stats,
    output_throughput,
    paired_ratio_interval,
    position_rates,
    summarize,
)
from specbuild.bench.rows import ROW_KEYS
from specbuild.bench.run import BenchSettings, run_bench
from specbuild.bench.served import sglang_engine, stream_generate
from specbuild.eagle.chain import BASELINE, Chain
from specbuild.engines.server import ServerOptions, ServerSpec, SGLangServer
from specbuild.infra.io import read_json, read_jsonl

STUB_SERVER = ServerOptions(launcher=LAUNCHER, startup_timeout_s=60)


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, target_dir, random_drafter) -> Path:
    cfg = json.loads((target_dir / "config.json").read_text())
    return random_drafter(tmp_path_factory.mktemp("drafter"), cfg, [1, 14, 26])


# --- metrics ---------------------------------------------------------------------------------


def req(completion, verify, *, chain="3-1-4", wall=1.0, ttft=0.1, start=0.0, accepted=()):
    return {
        "chain": chain,
        "completion_tokens": completion,
        "verify_steps": verify,
        "accepted_per_position": list(accepted),
        "start_s": start,
        "wall_s": wall,
        "ttft_s": ttft,
        "itl_s": inter_token_latency(wall, ttft, completion),
    }


def test_acceptance_length_is_sglangs_sum_of_tokens_over_sum_of_verify_steps():
    rows = [req(9, 4), req(5, 2)]
    assert summarize(rows)["accept_length"] == 14 / 6  # not the mean of 9/4 and 5/2
    assert acceptance_length(9, 4, "3-1-4") == 2.25
    assert acceptance_length(1, 0, "3-1-4") is None  # EOS from prefill: no verify step
    base = summarize([req(9, None, chain=BASELINE)])
    assert base["accept_length"] == 1.0 and base["verify_steps"] is None


def test_the_interval_needs_five_requests_and_never_falls_below_one():
    assert acceptance_interval([9, 5, 7, 8], [4, 2, 3, 4]) == (None, None)
    completion = [2, 2, 2, 2, 30, 2]  # five requests accepting nothing, one accepting a lot
    verify = [1, 1, 1, 1, 10, 1]
    lo, hi = acceptance_interval(completion, verify)
    assert 1.0 <= lo < sum(completion) / sum(verify) < hi <= 3.0
    assert acceptance_interval(completion, verify) == (lo, hi)  # seeded


def test_the_paired_interval_cancels_what_both_runs_share():
    """Requests of very different difficulty, B accepting 5% more on each: the unpaired
    intervals overlap widely, the paired one is tight around 1.05 and excludes 1."""
    completion = [64] * 20
    verify_a = [16 + 2 * i for i in range(20)]  # acceptance 4.0 down to ~1.2
    verify_b = [v / 1.05 * (1 + 0.01 * (-1) ** i) for i, v in enumerate(verify_a)]  # +-1%
    ratio, lo, hi = paired_ratio_interval(completion, verify_a, completion, verify_b)
    assert ratio == pytest.approx(1.05, abs=0.002) and 1.03 < lo < ratio < hi < 1.07
    a_lo, a_hi = acceptance_interval(completion, verify_a)
    b_lo, b_hi = acceptance_interval(completion, verify_b)
    assert b_lo < a_hi  # the unpaired intervals cannot tell the runs apart
    assert paired_ratio_interval(completion[:4], verify_a[:4], completion[:4], verify_a[:4]) == (
        1.0,
        None,
        None,
    )


def test_latencies_are_mean_and_percentiles_over_requests():
    assert inter_token_latency(1.1, 0.1, 11) == pytest.approx(0.1)
    assert inter_token_latency(1.0, 0.1, 1) is None
    stats = latency_stats(range(1, 102), "ttft_s")  # 1..101: percentile p is 1 + p
    assert stats == {
        "ttft_s_mean": 51.0,
        "ttft_s_p50": 51.0,
        "ttft_s_p90": 91.0,
        "ttft_s_p99": 100.0,
    }
    assert latency_stats([None], "itl_s")["itl_s_p50"] is None


def test_throughput_single_stream_pools_wall_time_and_concurrent_takes_the_span():
    rows = [req(10, 4, wall=2.0, start=0.0), req(30, 10, wall=3.0, start=1.0)]
    assert summarize(rows)["tokens_per_s"] == 40 / 5.0  # one request at a time
    assert output_throughput(rows) == 40 / 4.0  # in flight together: from 0 to 4 s


def test_position_rates_pool_accepted_drafts_over_verify_steps():
    rows = [req(33, 16, accepted=[10, 5, 1]), req(33, 8, accepted=[8, 8, 8])]
    assert position_rates([r["accepted_per_position"] for r in rows], 24) == [
        18 / 24,
        13 / 24,
        9 / 24,
    ]
    s = summarize(rows)
    assert (s["accept_pos1"], s["accept_pos3"]) == (18 / 24, 9 / 24)


# --- served engines against the stub ---------------------------------------------------------


def test_sglang_rows_use_spec_verify_ct(target_dir, drafter):
    server = ServerOptions(launcher=LAUNCHER, env={"SGLANG_STUB_ACCEPT": "3"})
    spec = server.spec(target_dir, extra_args=Chain.parse("3-1-4").server_args(drafter))
    with SGLangServer(spec) as srv:
        engine = sglang_engine(srv, chain="3-1-4", drafter="ours", timeout=30)
        c = engine.complete([10, 20, 30], max_new_tokens=13)
    assert c.completion_tokens == len(c.token_ids) and c.ttft_s <= c.wall_s
    assert c.verify_steps == math.ceil((c.completion_tokens - 1) / 3)  # 3 tokens per verify
    assert engine.device == "cpu (stub)"  # the server's own word; + the GPU's name on CUDA
    assert "api_key" not in repr(engine)


def test_a_chain_server_without_a_drafter_fails_instead_of_scoring_one(target_dir):
    with SGLangServer(STUB_SERVER.spec(target_dir)) as srv:
        engine = sglang_engine(srv, chain="3-1-4", drafter="ours", timeout=30)
        with pytest.raises(RuntimeError, match="no spec_verify_ct"):
            engine.complete([1, 2, 3], 8)


def _bench(tmp_path, target_dir, engine, chain, options, **kw):
    out = tmp_path / engine / f"{chain}.jsonl"
    run_bench(
        engine=engine,
        target_dir=target_dir,
        chain=chain,
        out=out,
        options=options,
        settings=BenchSettings(
            sets={"mt_bench": {**MT_BENCH, "limit": 2}},
            max_new_tokens=12,
            concurrency=[1, 3],
            sweep_min_requests=4,
        ),
        **kw,
    )
    return list(read_jsonl(out))


def test_the_sglang_engine_benches_every_turn_then_sweeps_with_its_key(
    tmp_path, target_dir, drafter, caplog
):
    server = replace(STUB_SERVER, server_args={"disable_radix_cache": True})
    options = {"server": asdict(server)}
    for chain in (BASELINE, "3-1-4"):
        with caplog.at_level(logging.INFO, logger="specbuild"):
            rows = _bench(
                tmp_path,
                target_dir,
                "sglang",
                chain,
                options,
                drafter_dir=str(drafter) if chain != BASELINE else None,
                drafter_name="ours",
            )
        # the server demanded a key (the stub answers 401 without it), and the bench sent it
        assert "--config " in caplog.text and "api_key='***'" in caplog.text
        assert all(list(r) == list(ROW_KEYS) for r in rows)
        bench = [r for r in rows if r["phase"] == "bench"]
        assert [(r["prompt_id"], r["turn"]) for r in bench] == [
            ("81", 1),
            ("81", 2),
            ("82", 1),
            ("82", 2),
        ]
        sweep = [(r["concurrency"], r["turn"]) for r in rows if r["phase"] == "sweep"]
        assert sweep == [(1, 1)] * 4 + [(3, 1)] * 4
        s = summarize(bench)
        if chain == BASELINE:
            assert s["accept_length"] == 1.0 and bench[0]["drafter"] == "none"
        else:
            assert s["accept_length"] > 1.0 and bench[0]["drafter"] == "ours"


def test_the_openai_engine_measures_an_existing_endpoint_with_the_same_client(
    tmp_path, target_dir, monkeypatch
):
    secret = "sk-endpoint-key-0123456789"
    monkeypatch.setenv("BENCH_TEST_KEY", secret)
    launcher = (*LAUNCHER, "--api-key", secret)
    with SGLangServer(ServerSpec(str(target_dir), launcher=launcher, startup_timeout_s=20)) as srv:
        options = {
            "endpoint": srv.base_url + "/v1",
            "api_key_env": "BENCH_TEST_KEY",
            "served_model": None,
            "name": "vllm",
            "request_timeout_s": 30,
        }
        rows = _bench(tmp_path, target_dir, "openai", BASELINE, options)
    assert {r["engine"] for r in rows} == {"vllm"} and rows[0]["device"].startswith("endpoint ")
    bench = [r for r in rows if r["phase"] == "bench"]
    assert len(bench) == 4 and all(r["completion_tokens"] > 0 for r in bench)
    assert all(r["ttft_s"] <= r["wall_s"] and r["verify_steps"] is None for r in bench)
    assert len([r for r in rows if r["phase"] == "sweep"]) == 8
    assert secret not in (tmp_path / "openai" / "baseline.jsonl").read_text()


def test_the_openai_stream_counts_tokens_from_the_usage_chunk(target_dir):
    from specbuild.bench.served import stream_completions

    with SGLangServer(STUB_SERVER.spec(target_dir)) as srv:
        c = stream_completions(srv.base_url, "m", [5, 6, 7], 9, api_key=srv.api_key, timeout=30)
        ref = stream_generate(srv.base_url, [5, 6, 7, 0], 9, api_key=srv.api_key, timeout=30)
    assert c.completion_tokens == ref.completion_tokens  # seed 0 appended, as the stub does
    assert len(c.text.split()) == c.completion_tokens


# --- the real SGLang (device machine) --------------------------------------------------------


def _sglang_available() -> bool:
    try:
        import sglang  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.gpu
@pytest.mark.skipif(
    not _sglang_available(), reason="needs SGLang (a GPU machine with SGLang 0.5.17)"
)
@pytest.mark.parametrize("layout", ["deepseek_target", "kimi_target"])
def test_a_drafter_for_a_deepseek_target_serves_with_eagle3_on_mla(
    tmp_path, layout, request, random_drafter, tokenizer, sglang_test_options
):
    # DeepSeek-V3 as is, and wrapped as Kimi-K2.5 (KimiK25ForConditionalGeneration)
    from specbuild.bench.served import open_sglang

    deepseek_target = request.getfixturevalue(layout)
    config = json.loads((deepseek_target / "config.json").read_text())
    drafter = random_drafter(tmp_path / "drafter", config, [2, 3, 5])
    eagle = read_json(drafter / "config.json")["eagle_config"]
    assert eagle["eagle_aux_hidden_state_layer_ids"] == [3, 4, 6]  # SGLang's DeepSeek rule
    server = ServerOptions(
        server_args={
            **sglang_test_options["server_args"],
            "grammar_backend": "none",
            "mem_fraction_static": sglang_test_options["mem_fraction_static"],
            "context_length": 2048,
            "cuda_graph_max_bs_decode": 4,
            # Kimi-K2.5's processor is remote code: SGLang loads it for every request's path
            "trust_remote_code": layout == "kimi_target",
        },
        draft_attention_backend="triton",
        startup_timeout_s=600,
    )
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colours."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    with open_sglang(
        target_dir=deepseek_target,
        chain="3-1-4",
        drafter_dir=str(drafter),
        drafter_name="random",
        options={"server": asdict(server)},
    ) as engine:
        c = engine.complete(list(prompt), max_new_tokens=32)
    print("DeepSeek-V3 EAGLE-3 3-1-4:", c.completion_tokens, "tokens,", c.verify_steps, "cycles")
    assert c.verify_steps and 1 <= c.completion_tokens / c.verify_steps <= 4 + 1
