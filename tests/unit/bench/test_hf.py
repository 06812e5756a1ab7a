"""Bench stage: speculative decoding is lossless, prompt sets load strictly, rows keep the schema.

The losslessness gate: on 20 prompts from the bundled bench sets, the engine's output equals the
target's own `generate` (greedy), whatever the drafter proposes. A stand-in "oracle" drafter that
knows the greedy answer but corrupts a seeded share of its drafts drives every accept length
0..S, EOS inside an accepted run, and max_new_tokens cutting one; it also checks that each call
continues its cache exactly where the engine's rollback left it.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import torch

from specbuild.bench.hf import (
    HFBaseline,
    HFSpecDecoder,
    cache_kwarg,
    eos_token_ids,
    load_drafter,
)
from specbuild.bench.metrics import acceptance_length
from specbuild.bench.rows import ROW_KEYS, Completion, check_rows, run_requests
from specbuild.bench.run import BenchSettings, merge_rows, plan_bench, run_bench, split_prompts
from specbuild.bench.sets import BenchPrompt, read_bench_prompts, render_prompt
from specbuild.eagle.chain import Chain

REPO = Path(__file__).resolve().parents[3]
BENCH = REPO / "resources" / "bench"
MAX_NEW = 16


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Single-token decode steps are too small to split; on a busy 2-core box a second
    # thread only waits for the first.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class ListCache:
    """Test stand-in for DrafterCache: only the length matters to the oracle."""

    def __init__(self):
        self.length = 0

    def crop(self, n: int) -> None:
        assert 0 <= n <= self.length
        self.length = n


class OracleDrafter(torch.nn.Module):
    """Drafts seq[p + 2] at drafter position p (token x_{p+1} beside aux g_p), except where a
    seeded coin says to propose a wrong token instead."""

    def __init__(self, vocab: int, hidden: int, wrong: float, seed: int = 0):
        super().__init__()
        self.vocab, self.hidden, self.wrong, self.seed = vocab, hidden, wrong, seed
        self.seq: list[int] = []

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        return aux[..., : self.hidden]  # shape: [B, T, H]

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids

    def forward(self, input_ids, hidden, position_ids, cache=None):
        n = input_ids.shape[1]
        # The engine must continue the cache where its rollback left it.
        assert position_ids[0].tolist() == list(range(cache.length, cache.length + n))
        cache.length += n
        logits = torch.zeros(1, n, self.vocab)
        for j, p in enumerate(position_ids[0].tolist()):
            want = self.seq[p + 2] if p + 2 < len(self.seq) else 0
            if random.Random(self.seed * 100_003 + p).random() < self.wrong:
                want = (want + 1) % self.vocab
            logits[0, j, want] = 1.0
        return hidden, logits


def bench_prompts(n_each: dict[str, int]) -> list[list[dict]]:
    sets = {
        "mt_bench": read_bench_prompts(BENCH / "mt_bench.jsonl", format="turns", limit=8),
        "gsm8k": read_bench_prompts(BENCH / "gsm8k_test.jsonl", format="prompt", key="question"),
        "humaneval": read_bench_prompts(BENCH / "humaneval.jsonl", format="prompt", limit=8),
    }
    return [
        [{"role": "user", "content": p.turns[0]}]
        for name, k in n_each.items()
        for p in sets[name][:k]
    ]


@pytest.fixture(scope="module")
def reference(target_model, tokenizer):
    """(prompt ids, greedy completion from transformers' generate) for 20 bench prompts."""
    eos = sorted(eos_token_ids(target_model, tokenizer))
    cases = []
    for messages in bench_prompts({"mt_bench": 7, "gsm8k": 7, "humaneval": 6}):
        ids = render_prompt(tokenizer, messages)
        with torch.inference_mode():
            out = target_model.generate(
                torch.tensor([ids]),
                max_new_tokens=MAX_NEW,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
        cases.append((ids, out[0, len(ids) :].tolist()))
    return cases


def make_spec(target_model, tokenizer, drafter, chain: str) -> HFSpecDecoder:
    return HFSpecDecoder(
        target_model,
        drafter,
        layer_ids=[1, 14, 26],
        chain=Chain.parse(chain),
        eos_ids=eos_token_ids(target_model, tokenizer),
        drafter_name="oracle",
        new_cache=ListCache,
    )


@pytest.mark.parametrize("chain,wrong", [("3-1-4", 0.35), ("7-1-8", 0.15)])
def test_speculative_output_equals_greedy_generate_on_20_bench_prompts(
    target_model, tokenizer, reference, chain, wrong
):
    cfg = target_model.config
    drafter = OracleDrafter(cfg.vocab_size, cfg.hidden_size, wrong=wrong)
    spec = make_spec(target_model, tokenizer, drafter, chain)
    steps = Chain.parse(chain).steps
    accepted = [0] * steps
    for ids, greedy in reference:
        drafter.seq = ids + greedy
        got = spec.complete(ids, MAX_NEW)
        assert got.token_ids == greedy
        accepted = [a + b for a, b in zip(accepted, got.accepted_per_position, strict=True)]
        # chain drafting: position k can only be accepted when position k-1 was
        assert got.accepted_per_position == sorted(got.accepted_per_position, reverse=True)
    # the seeded corruption leaves both full and partial acceptances in the run
    assert accepted[0] > accepted[-1] > 0


def test_perfect_drafter_commits_steps_plus_one_tokens_per_verify(target_model, tokenizer):
    ids = render_prompt(tokenizer, [{"role": "user", "content": "Count from 1 to 30."}])
    base = HFBaseline(target_model, eos_ids=eos_token_ids(target_model, tokenizer))
    greedy = base.complete(ids, 17).token_ids
    assert len(greedy) == 17  # no EOS inside, so every step below is a full one
    drafter = OracleDrafter(target_model.config.vocab_size, target_model.config.hidden_size, 0.0)
    drafter.seq = ids + greedy + [0] * 8
    got = make_spec(target_model, tokenizer, drafter, "3-1-4").complete(ids, 17)
    # 1 prefill token + 4 verify steps of 4 tokens each
    assert got.token_ids == greedy
    assert (got.verify_steps, got.accepted_per_position) == (4, [4, 4, 4])
    # SGLang's convention counts the prefill token too: 17 tokens over 4 verify steps
    assert acceptance_length(len(got.token_ids), got.verify_steps, "3-1-4") == 17 / 4


class PastKeyValuesTarget(torch.nn.Module):
    """The target behind an older transformers forward signature (5.12, as installed beside
    SGLang 0.5.17 on the H200): the KV cache comes as `past_key_values`, and an unknown
    keyword such as `cache` disappears into **kwargs, exactly as that release's forward does."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config, self.generation_config = model.config, model.generation_config

    @property
    def device(self) -> torch.device:
        return self.model.device

    def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):
        kwargs.pop("cache", None)  # not a keyword of this signature: silently dropped
        # hand the cache on under the installed transformers' own keyword
        inner = {cache_kwarg(self.model): past_key_values}
        return self.model(input_ids=input_ids, use_cache=use_cache, **inner, **kwargs)


class CacheIgnoringTarget(PastKeyValuesTarget):
    """A target whose forward takes the cache keyword but never fills the cache."""

    def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs):
        return self.model(input_ids=input_ids, use_cache=False, **kwargs)


def test_target_taking_past_key_values_decodes_greedily_and_accepts_drafts(target_model, tokenizer):
    """Regression: the engine passed `cache=` to every target; transformers 5.12 (beside SGLang
    on the H200) names it `past_key_values` and dropped the cache unseen, so each verify forward
    read only its own 8 tokens and the H200 bench accepted nothing (acceptance exactly 1.00)."""
    ids = render_prompt(tokenizer, [{"role": "user", "content": "Count from 1 to 30."}])
    greedy = HFBaseline(target_model, eos_ids={2}).complete(ids, 17).token_ids
    old = PastKeyValuesTarget(target_model)
    assert HFBaseline(old, eos_ids={2}).complete(ids, 17).token_ids == greedy
    drafter = OracleDrafter(target_model.config.vocab_size, target_model.config.hidden_size, 0.0)
    drafter.seq = ids + greedy + [0] * 8
    got = make_spec(old, tokenizer, drafter, "3-1-4").complete(ids, 17)
    assert got.token_ids == greedy
    assert (got.verify_steps, got.accepted_per_position) == (4, [4, 4, 4])


def test_target_that_ignores_its_kv_cache_is_refused_not_benched(target_model, tokenizer):
    ids = render_prompt(tokenizer, [{"role": "user", "content": "Hi"}])
    drafter = OracleDrafter(target_model.config.vocab_size, target_model.config.hidden_size, 0.0)
    drafter.seq = ids + [0] * 16
    broken = CacheIgnoringTarget(target_model)
    for engine in (
        HFBaseline(broken, eos_ids={2}),
        make_spec(broken, tokenizer, drafter, "3-1-4"),
    ):
        with pytest.raises(RuntimeError, match=r"did not extend its KV cache \(0 -> 0 positions"):
            engine.complete(ids, 4)


def export_random_drafter(target_model, out: Path, draft_vocab: int = 2048) -> Path:
    """An exported folder (config.json + model.safetensors) of a seeded, untrained drafter."""
    from safetensors.torch import save_file

    from specbuild.drafter.model import DrafterConfig, Eagle3Drafter
    from specbuild.export import check_export, hf_config

    target_cfg = target_model.config.to_dict()
    cfg = DrafterConfig.from_target(target_cfg, draft_vocab_size=draft_vocab)
    torch.manual_seed(0)
    drafter = Eagle3Drafter(cfg)
    drafter.t2d[:draft_vocab] = True  # draft id i is target id i (d2t stays 0)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in drafter.export_state().items()}, out / "model.safetensors"
    )
    config = hf_config(cfg, layer_ids=[1, 14, 26], target_config=target_cfg, dtype="float32")
    (out / "config.json").write_text(json.dumps(config))
    check_export(out)
    return out


def test_exported_drafter_loads_like_sglang_and_decodes_losslessly(
    target_model, tokenizer, reference, tmp_path
):
    folder = export_random_drafter(target_model, tmp_path / "drafter")
    drafter, layer_ids = load_drafter(folder, target_model)
    assert layer_ids == [1, 14, 26]
    spec = HFSpecDecoder(
        target_model,
        drafter,
        layer_ids=layer_ids,
        chain=Chain.parse("3-1-4"),
        eos_ids=eos_token_ids(target_model, tokenizer),
        drafter_name="random",
    )
    for ids, greedy in reference[::5]:
        got = spec.complete(ids, MAX_NEW)
        assert got.token_ids == greedy
        assert got.verify_steps >= 1


def test_a_specforge_style_folder_loads_with_sglangs_default_layers(target_model, tmp_path):
    # another trainer's export: no eagle_config (SGLang then captures its default layers), no
    # head_dim, and the embedding inside the folder (SGLang replaces it with the target's)
    from safetensors.torch import load_file, save_file

    folder = export_random_drafter(target_model, tmp_path / "drafter")
    ours, _ = load_drafter(folder, target_model)
    config = json.loads((folder / "config.json").read_text())
    del config["eagle_config"], config["head_dim"]
    (folder / "config.json").write_text(json.dumps(config))
    tensors = load_file(folder / "model.safetensors")
    tensors["embed_tokens.weight"] = torch.zeros(49152, 576)
    save_file(tensors, folder / "model.safetensors")
    theirs, layer_ids = load_drafter(folder, target_model)
    assert layer_ids == [1, 14, 26]  # EAGLE-3's default for a 30-layer target, as SGLang's
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)  # the target's embedding, not the zeros


def test_drafter_for_another_target_is_refused_with_every_mismatch(target_model, tmp_path):
    folder = export_random_drafter(target_model, tmp_path / "drafter")
    config = json.loads((folder / "config.json").read_text())
    config["target_hidden_size"] = 4096
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 14, 99]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as err:
        load_drafter(folder, target_model)
    assert "target_hidden_size is 4096, the target has 576" in str(err.value)
    assert "aux layer ids [1, 14, 99] outside" in str(err.value)


def test_engine_drafts_exactly_what_the_training_unroll_predicts():
    """Train/serve alignment: at index t, training's unrolled steps 0..2 (token x[t+1+i] at
    position t+i beside g_t, then its own hidden) must give the logits of the engine's chain
    d1, d2, d3 when the sequence continues with the engine's own drafts."""
    from types import SimpleNamespace

    from specbuild.drafter.model import DrafterCache, DrafterConfig, Eagle3Drafter

    cfg = DrafterConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=100,
        draft_vocab_size=100,
        target_hidden_size=32,
    )
    torch.manual_seed(0)
    drafter = Eagle3Drafter(cfg).eval()
    drafter.embed_tokens.weight.normal_(std=1.0)
    seen: list[torch.Tensor] = []  # last-position logits of every drafter call, in order
    forward = drafter.forward

    def recording_forward(*args, **kwargs):
        hidden, logits = forward(*args, **kwargs)
        seen.append(logits[0, -1])
        return hidden, logits

    drafter.forward = recording_forward
    spec = HFSpecDecoder(
        SimpleNamespace(device=torch.device("cpu")),
        drafter,
        layer_ids=[0, 1, 2],
        chain=Chain.parse("3-1-4"),
        eos_ids={0},
        drafter_name="tiny",
    )
    t = 9
    x = torch.randint(1, 100, (t + 2,)).tolist()  # x0 .. x_{t+1}
    aux = torch.randn(1, t + 3, 3 * 32)  # g_0 .. g_{t+2}
    with torch.inference_mode():
        drafts = spec._draft(x[1:], aux[:, : t + 1], DrafterCache())
        u = torch.tensor([x[1:] + drafts[:2]])  # step-0 tokens, continued by d1, d2
        outs = drafter.unroll(u, aux, torch.arange(t + 3)[None], steps=3)
    trained = torch.stack([drafter.logits(h[0, t]) for h in outs])  # shape: [3, Vd]
    assert trained.argmax(-1).tolist() == drafts
    # RoPE makes a position slip move the logits by ~1e-3 here: compare values, not only argmax
    torch.testing.assert_close(torch.stack(seen), trained, atol=1e-5, rtol=1e-5)


def test_baseline_engine_equals_greedy_generate(target_model, tokenizer, reference):
    base = HFBaseline(target_model, eos_ids=eos_token_ids(target_model, tokenizer))
    for ids, greedy in reference[:3]:
        got = base.complete(ids, MAX_NEW)
        assert got.token_ids == greedy
        assert got.verify_steps is None  # no drafter: no verify steps to count


def test_the_hf_engine_refuses_tree_drafting(target_model, tokenizer):
    drafter = OracleDrafter(target_model.config.vocab_size, target_model.config.hidden_size, 0.0)
    with pytest.raises(ValueError, match="chains only \\(topk 1\\)"):
        make_spec(target_model, tokenizer, drafter, "3-2-4")


def write_lines(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_each_set_format_reads_user_turns_in_order(tmp_path):
    p = write_lines(tmp_path / "p.jsonl", [{"q": "a", "id": 7}, {"q": "b", "id": 8}])
    assert read_bench_prompts(p, format="prompt", key="q", id_key="id") == [
        BenchPrompt("7", ("a",)),
        BenchPrompt("8", ("b",)),
    ]
    t = write_lines(tmp_path / "t.jsonl", [{"turns": ["x", "y", "z"]}])
    assert read_bench_prompts(t, format="turns", turns=2) == [BenchPrompt("0", ("x", "y"))]
    conv = [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a"}]
    m = write_lines(
        tmp_path / "m.jsonl", [{"messages": conv + [{"role": "user", "content": "u2"}]}]
    )
    assert read_bench_prompts(m, format="messages") == [BenchPrompt("0", ("u1", "u2"))]


def test_limit_takes_the_first_rows_of_the_mt_bench_file():
    got = read_bench_prompts(
        BENCH / "mt_bench.jsonl", format="turns", id_key="question_id", limit=3
    )
    assert [p.id for p in got] == ["81", "82", "83"]
    assert all(len(p.turns) == 2 for p in got)


def test_bad_set_file_lists_every_bad_line_with_the_fix(tmp_path):
    p = write_lines(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"question": "x"}, {"prompt": ""}])
    with pytest.raises(ValueError) as err:
        read_bench_prompts(p, format="prompt")
    msg = str(err.value)
    assert "bad.jsonl:2: no key 'prompt'" in msg
    assert "bad.jsonl:3: " in msg
    assert "bench.sets" in msg


class ScriptedEngine:
    name, device, chain, drafter = "fake", "cpu", "3-1-4", "d"

    def __init__(self, tokenizer):
        self.answer = tokenizer("FIRST-ANSWER", add_special_tokens=False)["input_ids"]
        self.prompts: list[list[int]] = []

    def complete(self, prompt_ids, max_new_tokens):
        self.prompts.append(prompt_ids)
        n = len(self.answer)
        return Completion(n, 2, 0.5, accepted_per_position=[2, 1, 0], token_ids=self.answer)


def test_second_turn_prompt_carries_the_models_own_first_answer(tokenizer):
    backend = ScriptedEngine(tokenizer)
    prompt = BenchPrompt("81", ("Say hi.", "Again."))
    rows = list(
        run_requests(
            [prompt],
            engine=backend,
            tokenizer=tokenizer,
            set_name="mt",
            max_new_tokens=8,
            t0=time.monotonic(),
        )
    )
    assert [r["turn"] for r in rows] == [1, 2]
    second = tokenizer.decode(backend.prompts[1])
    assert second.index("Say hi.") < second.index("FIRST-ANSWER") < second.index("Again.")
    check_rows(rows)
    assert list(rows[0]) == list(ROW_KEYS)
    n = len(backend.answer)
    assert rows[0]["accept_length"] == n / 2  # Σ completion / Σ verify
    assert rows[0]["tokens_per_s"] == n / 0.5 and rows[1]["start_s"] >= rows[0]["start_s"]


def test_check_rows_names_missing_and_unknown_keys():
    with pytest.raises(ValueError, match=r"missing \['wall_s'.*unknown \['foo'\]"):
        check_rows([{k: 0 for k in ROW_KEYS if k not in ("wall_s", "tokens_per_s")} | {"foo": 1}])


# bfloat16 logits near 20 are 0.125 apart; kernels of a 1-token and a k-token forward may
# round a near-tie either way, which then changes the rest of the text.
BF16_TIE = 0.5


def _first_difference(a: list[int], b: list[int]) -> int | None:
    k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return None if a == b else k


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_speculative_output_equals_greedy_generate_on_cuda(target_dir, tokenizer, tmp_path, dtype):
    """On the GPU: float32 must match greedy exactly on all 20 prompts. bfloat16 is not
    lossless by construction (the verify forward and greedy's 1-token forwards round
    differently), so there every divergence must start at a near-tie of the target's logits,
    with the speculative token one of the two best: a wrong rollback or cache would diverge
    where the target is sure."""
    from specbuild.target import load_target_model

    target = load_target_model(target_dir, dtype=dtype, device="cuda")
    folder = export_random_drafter(target, tmp_path / "drafter")
    drafter, layer_ids = load_drafter(folder, target)
    eos = eos_token_ids(target, tokenizer)
    spec = HFSpecDecoder(
        target,
        drafter,
        layer_ids=layer_ids,
        chain=Chain.parse("7-1-8"),
        eos_ids=eos,
        drafter_name="random",
    )
    prompts = bench_prompts({"mt_bench": 7, "gsm8k": 7, "humaneval": 6})
    diverged = []
    for messages in prompts:
        ids = render_prompt(tokenizer, messages)
        with torch.inference_mode():
            out = target.generate(
                torch.tensor([ids], device="cuda"),
                max_new_tokens=64,
                do_sample=False,
                eos_token_id=sorted(eos),
                pad_token_id=min(eos),
            )
        greedy = out[0, len(ids) :].tolist()
        got = spec.complete(ids, 64).token_ids
        k = _first_difference(got, greedy)
        if k is not None:
            diverged.append((ids, greedy, got, k))
    if dtype == "float32":
        assert diverged == []
    for ids, greedy, got, k in diverged:
        with torch.inference_mode():
            logits = target(torch.tensor([ids + greedy[:k]], device="cuda")).logits[0, -1]
        top = logits.float().topk(2)
        margin = float(top.values[0] - top.values[1])
        assert margin <= BF16_TIE, f"diverged at token {k} where the target's margin is {margin}"
        if k < len(got):
            assert got[k] in top.indices.tolist()


def test_prompts_dealt_over_workers_merge_back_in_one_process_order():
    sets = {
        "mt": [BenchPrompt("81", ("a", "b")), BenchPrompt("82", ("c", "d"))],
        "gsm8k": [BenchPrompt("0", ("e",)), BenchPrompt("1", ("f",)), BenchPrompt("2", ("g",))],
    }
    parts = split_prompts(sets, 2)
    assert [{k: [p.id for p in v] for k, v in part.items()} for part in parts] == [
        {"mt": ["81"], "gsm8k": ["0", "2"]},
        {"mt": ["82"], "gsm8k": ["1"]},
    ]
    assert len(split_prompts(sets, 9)) == 5  # never more workers than prompts

    def rows(part):  # what a worker returns: its prompts' turns, then its sweep
        out = [
            {"set": s, "prompt_id": p.id, "turn": t, "phase": "bench"}
            for s, ps in part.items()
            for p in ps
            for t in range(len(p.turns), 0, -1)  # turns out of order: merge sorts them
        ]
        return out + [{"set": "mt", "prompt_id": "81", "turn": 1, "phase": "sweep"}]

    merged = merge_rows(sets, [rows(p) for p in parts])
    keys = [(r["set"], r["prompt_id"], r["turn"], r["phase"]) for r in merged]
    assert keys[:7] == [
        ("mt", "81", 1, "bench"),
        ("mt", "81", 2, "bench"),
        ("mt", "82", 1, "bench"),
        ("mt", "82", 2, "bench"),
        ("gsm8k", "0", 1, "bench"),
        ("gsm8k", "1", 1, "bench"),
        ("gsm8k", "2", 1, "bench"),
    ]
    assert keys[7:] == [("mt", "81", 1, "sweep")] * 2
    stray = [{"set": "mt", "prompt_id": "99", "turn": 1, "phase": "bench"}]
    with pytest.raises(RuntimeError, match="99"):
        merge_rows(sets, [rows(parts[0]), rows(parts[1]) + stray])


def test_the_plan_deals_prompts_over_workers_and_only_the_first_part_sweeps():
    sets = {"mt": [BenchPrompt("81", ("a", "b"))], "gsm8k": [BenchPrompt("0", ("c",))]}
    settings = BenchSettings(sets={}, max_new_tokens=7, concurrency=[1, 4], sweep_min_requests=3)
    plan = plan_bench(sets, workers=4, settings=settings)
    assert plan.parts == tuple(split_prompts(sets, 4)) and len(plan.parts) == 2
    assert plan.part_args == (
        {"max_new_tokens": 7, "concurrency": [1, 4], "min_requests": 3},
        {"max_new_tokens": 7},
    )
    alone = plan_bench(sets, workers=1, settings=settings)
    assert alone.parts == (sets,) and alone.part_args == plan.part_args[:1]


def test_a_repeated_prompt_id_is_refused_with_both_lines(tmp_path):
    p = write_lines(tmp_path / "dup.jsonl", [{"id": 7, "prompt": "x"}, {"id": 7, "prompt": "y"}])
    with pytest.raises(ValueError, match=r"dup.jsonl:2: id '7' repeats line 1"):
        read_bench_prompts(p, format="prompt", id_key="id")


def test_two_worker_processes_write_the_rows_one_process_writes(target_dir, target_model, tmp_path):
    folder = export_random_drafter(target_model, tmp_path / "drafter")
    sets = {
        "mt_bench": {
            "path": str(BENCH / "mt_bench.jsonl"),
            "format": "turns",
            "id_key": "question_id",
            "limit": 2,
            "turns": 2,
        },
        "gsm8k": {
            "path": str(BENCH / "gsm8k_test.jsonl"),
            "format": "prompt",
            "key": "question",
            "limit": 1,
        },
    }
    got = {}
    for workers in (1, 2):
        rows = run_bench(
            engine="hf",
            target_dir=target_dir,
            chain="3-1-4",
            out=tmp_path / f"w{workers}.jsonl",
            options={"dtype": "float32", "device": "cpu", "threads": 1, "workers": workers},
            settings=BenchSettings(sets=sets, max_new_tokens=MAX_NEW, concurrency=()),
            drafter_dir=str(folder),
            drafter_name="random",
        )
        got[workers] = [
            (r["set"], r["prompt_id"], r["turn"], r["completion_tokens"], r["verify_steps"])
            for r in rows
        ]
    assert [k[:3] for k in got[1]][:2] == [("mt_bench", "81", 1), ("mt_bench", "81", 2)]
    assert len(got[1]) == 5 and got[2] == got[1]


@pytest.mark.parametrize("family", ["dflash", "dspark"])
def test_a_block_drafter_folder_loads_like_sglang_and_decodes_losslessly(
    target_model, target_dir, tokenizer, reference, tmp_path, family
):
    from specbuild.bench.hf import HFBlockDecoder, load_block
    from specbuild.drafter.block import BlockConfig, BlockDrafter
    from specbuild.drafter.state import save_drafter
    from specbuild.export import export_for_sglang

    target_cfg = target_model.config.to_dict()
    cfg = BlockConfig.from_target(
        target_cfg,
        family=family,
        drafts=4,
        num_layers=1,
        mask_token_id=16,
        markov_rank=8 if family == "dspark" else 0,
    )
    torch.manual_seed(0)
    meta = {
        "drafter_config": cfg.to_dict(),
        "layer_ids": [1, 14, 26],
        "target_config": target_cfg,
        "family": family,
    }
    save_drafter(tmp_path / "best.safetensors", BlockDrafter(cfg).export_state(), meta)
    export_for_sglang(checkpoint=tmp_path / "best.safetensors", out_dir=tmp_path / "d")
    drafter, layer_ids = load_block(tmp_path / "d", target_model, target_dir)
    assert layer_ids == [1, 14, 26]
    spec = HFBlockDecoder(
        target_model,
        drafter,
        layer_ids=layer_ids,
        eos_ids=eos_token_ids(target_model, tokenizer),
        drafter_name=family,
    )
    assert spec.chain == "4-1-5"  # 4 drafts a block, 5 tokens verified
    for ids, greedy in reference[::5]:
        got = spec.complete(ids, MAX_NEW)
        assert got.token_ids == greedy
        assert got.verify_steps >= 1
        assert got.accepted_per_position == sorted(got.accepted_per_position, reverse=True)
