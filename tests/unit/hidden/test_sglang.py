"""Stage `hidden` with SGLang's model runner in process (the runner itself:
tests/unit/engines/test_runner.py). On CPU: the feature adapter around the runner (packing
into shard order, refusals) against a fake runner that computes with transformers. On a GPU
(gpu-marked): the real SGLang runner against transformers shards, and tensor parallel 2
against 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specbuild.hidden.core import ShardFormat, plan_forward_batches, write_features
from specbuild.hidden.hf import HFFeatureBackend
from specbuild.hidden.hostcopy import HostCopier
from specbuild.hidden.sglang import SGLangFeatureBackend
from specbuild.hidden.shards import read_shard
from specbuild.hidden.tokens import TokenShard

LAYER_IDS = [1, 14, 26]  # SmolLM2-135M: 30 layers
REPO = Path(__file__).resolve().parents[3]


def _shard(lengths: list[int], seed: int = 0) -> TokenShard:
    g = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    total = int(offsets[-1])
    return TokenShard(
        path="<test>",
        ids=[f"s{i}" for i in range(len(lengths))],
        input_ids=torch.randint(0, 49152, (total,), generator=g, dtype=torch.int32),
        loss_mask=torch.ones(total, dtype=torch.uint8),
        offsets=offsets,
    )


# --- extraction through a runner --------------------------------------------------------------


def _extracted(path: Path, shard: TokenShard, backend, storage: str = "bf16", batch_tokens=64):
    """(shard tensors as read back, batches run) of the stage's own writing path."""
    meta = {
        "layer_ids": json.dumps(LAYER_IDS),
        "backend": backend.name,
        "target_fingerprint": "t",
        "tokenizer_fingerprint": "k",
        "dtype": storage,
        "specbuild_version": "test",
    }
    fmt = ShardFormat(hidden_size=576, storage=storage)
    written = write_features(path, shard, backend, meta, fmt, batch_tokens=batch_tokens)
    return read_shard(path)[0], written.batches


def test_sglang_backend_states_land_in_shard_order_like_hf(target_model, fake_runner, tmp_path):
    # mixed lengths, batches sorted longest first and split again by a small runner: every
    # sample must still land on its own rows
    shard = _shard([7, 30, 12, 30, 5, 19, 2, 25])
    runner = fake_runner(target_model, LAYER_IDS, max_tokens=64, max_requests=3)
    got, n_batches = _extracted(
        tmp_path / "sglang.safetensors", shard, SGLangFeatureBackend(runner), batch_tokens=96
    )
    want, _ = _extracted(
        tmp_path / "hf.safetensors",
        shard,
        HFFeatureBackend(target_model, LAYER_IDS),
        batch_tokens=1,
    )
    assert n_batches == len(plan_forward_batches([7, 30, 12, 30, 5, 19, 2, 25], 96))
    assert all(sum(c) <= 64 and len(c) <= 3 for c in runner.calls) and len(runner.calls) > 3
    for key in ("aux", "last"):
        torch.testing.assert_close(got[key].float(), want[key].float(), rtol=2**-7, atol=2e-2)


def test_fp8_storage_through_a_runner_keeps_aux_and_last_scales_per_token_and_layer(
    target_model, fake_runner, tmp_path
):
    shard = _shard([9, 4, 6])
    runner = fake_runner(target_model, LAYER_IDS)
    got, _ = _extracted(tmp_path / "fp8.safetensors", shard, SGLangFeatureBackend(runner), "fp8")
    assert got["aux"].dtype == torch.float8_e4m3fn and got["aux_scale"].shape == (19, 3)
    assert got["last"].dtype == torch.float8_e4m3fn and got["last_scale"].shape == (19, 1)
    assert bool((got["aux_scale"] > 0).all()) and bool((got["last_scale"] > 0).all())


@pytest.mark.parametrize(
    ("batch", "match"),
    [([[1, 2], []], "sample 1 of the batch is empty"), ([[1, 49152]], "token id 49152 outside")],
)
def test_bad_input_is_refused_before_the_runner_sees_it(target_model, fake_runner, batch, match):
    runner = fake_runner(target_model, LAYER_IDS)
    with pytest.raises(ValueError, match=match):
        SGLangFeatureBackend(runner).extract(batch)
    assert runner.calls == []


def test_a_runner_losing_rows_fails_the_batch(target_model, fake_runner):
    runner = fake_runner(target_model, LAYER_IDS, drop_row=True)
    with pytest.raises(RuntimeError, match=r"SGLang returned 5 final and 5 aux rows for 6 tokens"):
        SGLangFeatureBackend(runner).extract([[1, 2, 3], [4, 5, 6]])


def test_closing_the_backend_closes_its_runner(target_model, fake_runner):
    runner = fake_runner(target_model, LAYER_IDS)
    SGLangFeatureBackend(runner).close()
    assert runner.closed


def test_host_copies_on_cpu_land_in_place():
    dst = torch.zeros(4, 2)
    copier = HostCopier("cpu")
    src = torch.arange(6.0).view(3, 2)
    # packed rows 0 and 1..2 go to shard rows 3 and 0..1
    copier.copy({"x": src}, [(slice(0, 1), slice(3, 4)), (slice(1, 3), slice(0, 2))], {"x": dst})
    copier.finish()
    assert dst.tolist() == [[2, 3], [4, 5], [0, 0], [0, 1]]


def test_scatter_tasks_cover_every_row_once_in_pieces_of_bounded_size(monkeypatch):
    from specbuild.hidden import hostcopy

    monkeypatch.setattr(hostcopy, "_TASK_BYTES", 64)
    staged = {"aux": torch.randn(10, 6).bfloat16(), "scale": torch.randn(10, 3)}
    spans = [(slice(0, 7), slice(3, 10)), (slice(7, 10), slice(0, 3))]
    out = {k: torch.zeros_like(v) for k, v in staged.items()}
    seen = {k: [] for k in staged}
    tasks = hostcopy._tasks(staged, spans)
    for task in tasks:
        # a task stops once it holds 64 bytes: at most one row-range over that
        assert sum((s.stop - s.start) * staged[k][0].nbytes for k, s, _ in task[:-1]) < 64
        for key, src, dst in task:
            hostcopy._copy_bytes(out[key][dst], staged[key][src])
            seen[key] += range(dst.start, dst.stop)
    assert all(sorted(rows) == list(range(10)) for rows in seen.values())
    for key in staged:
        assert torch.equal(out[key][3:10], staged[key][0:7])
        assert torch.equal(out[key][0:3], staged[key][7:10])


def test_samples_adjacent_in_the_batch_and_the_shard_copy_as_one_span():
    from specbuild.hidden.core import _spans

    offsets = [0, 3, 5, 9, 10]  # lengths 3, 2, 4, 1
    assert _spans([2, 0, 1, 3], [3, 2, 4, 1], offsets) == [
        (slice(0, 4), slice(5, 9)),
        (slice(4, 9), slice(0, 5)),  # samples 0 and 1: rows 0..5 of the shard in one copy
        (slice(9, 10), slice(9, 10)),
    ]


# --- the real SGLang runner (device machine) ---------------------------------------------------


def _sglang_available() -> bool:
    try:
        import sglang  # noqa: F401
    except ImportError:
        return False
    return True


def _extract_in_subprocess(tokenized: Path, target_dir: Path, out: Path, **kw) -> str:
    """One SGLang runner per process: SGLang sets up torch.distributed process-wide. Returns
    the process's stderr (its log)."""
    call = (
        "from specbuild.hidden.core import ShardFiles; from specbuild.hidden.extract import "
        "ExtractSettings, extract_shard; from specbuild.infra.io import setup_logging; import "
        "json, "
        "sys; setup_logging(None); a = json.loads(sys.argv[1]); "
        "extract_shard(ShardFiles(**a['files']), ExtractSettings(**a['settings']))"
    )
    args = {
        "files": {
            "tokens": str(tokenized),
            "meta": str(tokenized.with_name("00000.meta.json")),
            "fingerprint": str(target_dir / "fingerprint.json"),
            "out": str(out),
        },
        "settings": {"threads": None, **kw},
    }
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-c", call, json.dumps(args)],
        env=env,
        timeout=400,
        capture_output=True,
        text=True,
    )
    sys.stderr.write(proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stderr


def _tokenized_mt_bench(folder: Path, tokenizer, target_dir: Path, n: int = 24) -> Path:
    """Real chat rows (MT-Bench first turns, the target's template) as stage tokenize writes."""
    from specbuild.eagle.target_info import read_target_info
    from specbuild.infra.io import read_jsonl, write_json, write_jsonl

    rows = []
    for i, q in enumerate(list(read_jsonl(REPO / "resources/bench/mt_bench.jsonl"))[:n]):
        msgs = [{"role": "user", "content": q["turns"][0]}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        rows.append(
            {
                "id": f"mt{i}",
                "input_ids": ids,
                "loss_mask": [1] * len(ids),
                "seq_len": len(ids),
                "n_prompt_tokens": 0,
                "n_response_tokens": len(ids),
                "has_reasoning": False,
                "finish_reason": "stop",
            }
        )
    info = read_target_info(target_dir / "fingerprint.json")
    write_jsonl(folder / "00000.jsonl", rows)
    write_json(
        folder / "00000.meta.json",
        {
            "target_fingerprint": info.fingerprint,
            "tokenizer_fingerprint": info.tokenizer_fingerprint,
            "chat_template_sha256": info.chat_template_sha256,
            "rows": len(rows),
            "rejected": 0,
        },
    )
    return folder / "00000.jsonl"


AUX_NAMES = ("low", "mid", "high")


def _aux_cosines(a: Path, b: Path) -> tuple[list[list[float]], float]:
    """(mean cosine of a's aux layer i against b's aux layer j, for every i and j; mean cosine
    of the final states) of two shards of the same tokens."""
    from specbuild.hidden.shards import dequantize_state, read_shard

    (ta, ma), (tb, mb) = read_shard(a), read_shard(b)
    assert torch.equal(ta["input_ids"], tb["input_ids"]) and ma["layer_ids"] == mb["layer_ids"]
    h = ta["last"].shape[1]
    xa, xb = dequantize_state(ta, "aux"), dequantize_state(tb, "aux")
    cos = torch.nn.functional.cosine_similarity
    n = len(AUX_NAMES)
    grid = [
        [
            float(cos(xa[:, i * h : (i + 1) * h], xb[:, j * h : (j + 1) * h], dim=-1).mean())
            for j in range(n)
        ]
        for i in range(n)
    ]
    return grid, float(cos(ta["last"].float(), tb["last"].float(), dim=-1).mean())


def _layer_cosines(a: Path, b: Path) -> dict[str, float]:
    grid, last = _aux_cosines(a, b)
    return {name: grid[k][k] for k, name in enumerate(AUX_NAMES)} | {"last": last}


@pytest.mark.gpu
@pytest.mark.skipif(
    not _sglang_available(), reason="needs SGLang (a GPU machine with SGLang 0.5.17)"
)
def test_in_process_sglang_shards_agree_with_transformers_shards(
    tmp_path, target_dir, tokenizer, sglang_test_options
):
    from specbuild.hidden.shards import verify_shard_file

    tok = _tokenized_mt_bench(tmp_path, tokenizer, target_dir)
    sgl, hf = tmp_path / "sglang.safetensors", tmp_path / "hf.safetensors"
    options = sglang_test_options
    log = _extract_in_subprocess(
        tok, target_dir, sgl, backend="sglang", backend_options=options, batch_tokens=2048
    )
    # the runner leaves its process groups on close: torch warns at exit otherwise
    assert "destroy_process_group() was not called" not in log
    _extract_in_subprocess(tok, target_dir, hf, backend="hf", dtype="bfloat16", device="cuda")
    for path in (sgl, hf):
        verify_shard_file(path)  # the stage's own structural and value checks
    cos = _layer_cosines(sgl, hf)
    print("sglang vs hf mean cosine per layer:", cos)
    assert all(v > 0.999 for v in cos.values()), cos


def _even_headed_target(folder: Path, tokenizer_dir: Path) -> Path:
    """A random-weight Llama that splits over 2 GPUs (SmolLM2's 9 heads do not), saved with
    real weight files so both TP sizes load the same numbers, and SmolLM2's tokenizer."""
    from random_llama import write_random_llama

    from specbuild.target import materialize_target

    src = write_random_llama(
        folder / "src",
        tokenizer_dir,
        dtype=torch.bfloat16,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    materialize_target(
        source=str(src), name="tp-llama", out_dir=folder / "target", save_dtype="bfloat16"
    )
    return folder / "target"


@pytest.mark.gpu
@pytest.mark.skipif(
    not _sglang_available() or torch.cuda.device_count() < 2, reason="needs SGLang and 2 GPUs"
)
def test_tensor_parallel_2_shards_agree_with_tensor_parallel_1(
    tmp_path, target_dir, tokenizer, sglang_test_options
):
    target = _even_headed_target(tmp_path / "tp", target_dir)
    tok = _tokenized_mt_bench(tmp_path, tokenizer, target)
    outs = {}
    for tp in (1, 2):
        outs[tp] = tmp_path / f"tp{tp}.safetensors"
        args = {**sglang_test_options["server_args"], "tp_size": tp}
        options = {**sglang_test_options, "server_args": args}
        _extract_in_subprocess(tok, target, outs[tp], backend="sglang", backend_options=options)
    cos = _layer_cosines(outs[1], outs[2])
    print("tp2 vs tp1 mean cosine per layer:", cos)
    assert all(v > 0.999 for v in cos.values()), cos


@pytest.mark.gpu
@pytest.mark.skipif(
    not _sglang_available(), reason="needs SGLang (a GPU machine with SGLang 0.5.17)"
)
def test_deepseek_v3_states_from_sglang_agree_with_transformers_at_the_layers_asked(
    tmp_path, deepseek_target, tokenizer, sglang_test_options
):
    # MLA + MoE, aux states packed by SGLang in one tensor; a first layer id other than 1,
    # which SGLang's DeepSeek takes unshifted, so the runner must hand it [3, 4, 6]
    from specbuild.hidden.shards import read_shard

    tok = _tokenized_mt_bench(tmp_path, tokenizer, deepseek_target)
    sgl, hf = tmp_path / "sglang.safetensors", tmp_path / "hf.safetensors"
    options = sglang_test_options
    ids = [2, 3, 5]
    _extract_in_subprocess(
        tok,
        deepseek_target,
        sgl,
        backend="sglang",
        backend_options=options,
        layer_ids=ids,
        batch_tokens=2048,
    )
    _extract_in_subprocess(
        tok, deepseek_target, hf, backend="hf", layer_ids=ids, dtype="bfloat16", device="cuda"
    )
    grid, last = _aux_cosines(sgl, hf)
    print("DeepSeek-V3: sglang (rows) vs hf (columns) mean cosine of the aux layers:", grid)
    print("DeepSeek-V3: final states' mean cosine:", last)
    # Two engines on a random MoE part by more than on a dense model (seen on one H200: 0.997
    # at layer 2 down to 0.986 after the last of 8, routing ties flipping experts as bf16
    # rounding differs); the claim here is the layers: each of SGLang's matches HF's own
    # layer, and clearly better than any other layer asked (HF's layers 2, 3 and 5 of this
    # target meet at 0.73-0.88 mean cosine, in float32 on CPU).
    for i, name in enumerate(AUX_NAMES):
        assert grid[i][i] > 0.98, (name, grid)
        assert all(grid[i][i] > grid[i][j] + 0.05 for j in range(3) if j != i), (name, grid)
    assert last > 0.98, last
    for path in (sgl, hf):
        assert json.loads(read_shard(path)[1]["eagle_layer_ids"]) == [3, 4, 6]


@pytest.mark.gpu
@pytest.mark.skipif(
    not _sglang_available(), reason="needs SGLang (a GPU machine with SGLang 0.5.17)"
)
def test_kimi_k25_layout_gives_the_states_of_the_same_deepseek_text_model(
    tmp_path, deepseek_target, kimi_target, tokenizer, sglang_test_options
):
    # SGLang's KimiK25ForConditionalGeneration around the same DeepSeek-V3 weights, with no
    # vision weights in the folder: its text states must be the plain target's
    from specbuild.hidden.shards import read_shard

    options = sglang_test_options
    shards = {}
    for name, target in (("deepseek", deepseek_target), ("kimi", kimi_target)):
        tok = _tokenized_mt_bench(tmp_path / name, tokenizer, target)
        shards[name] = tmp_path / f"{name}.safetensors"
        _extract_in_subprocess(
            tok,
            target,
            shards[name],
            backend="sglang",
            backend_options=options,
            layer_ids=[2, 3, 5],
            batch_tokens=2048,
        )
    cos = _layer_cosines(shards["deepseek"], shards["kimi"])
    print("Kimi-K2.5 layout vs DeepSeek-V3: mean cosine per layer:", cos)
    assert all(v > 0.999 for v in cos.values()), cos
    assert json.loads(read_shard(shards["kimi"])[1]["eagle_layer_ids"]) == [3, 4, 6]
