"""Stage `hidden`: stored features equal the target's own hidden states, and bad shards or
mismatched tokenizers stop the build with a message naming the file and the fix."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specbuild.eagle.target_info import read_target_info
from specbuild.engines.model import Features
from specbuild.engines.runtime import Runtime
from specbuild.hidden.core import ShardFiles, plan_forward_batches, resolve_layer_ids
from specbuild.hidden.extract import ExtractSettings, extract_shard
from specbuild.hidden.fp8 import dequantize_fp8, parse_storage, quantize_fp8
from specbuild.hidden.hf import HFFeatureBackend
from specbuild.hidden.shards import (
    ShardError,
    check_shard,
    dequantize_state,
    read_shard,
    shard_nbytes,
    verify_shard_file,
)
from specbuild.hidden.tokens import TokenizedShardError, read_token_shard
from specbuild.infra.io import read_json, write_json, write_jsonl

LAYER_IDS = [1, 14, 26]  # SmolLM2-135M: 30 layers
CHATS = [
    ("What is 2+2?", "4."),
    ("Name a colour.", "Blue, like a clear sky in the afternoon."),
    ("Hi", "Hello! How can I help you today?"),
]


def _rows(tokenizer) -> list[dict]:
    """Tokenized rows as the tokenize stage writes them; loss_mask 1 after the prompt."""
    rows = []
    for i, (user, answer) in enumerate(CHATS):
        msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        prompt = tokenizer.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(msgs, tokenize=False)
        ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        rows.append(
            {
                "id": f"s{i}",
                "input_ids": ids,
                "loss_mask": [0] * n_prompt + [1] * (len(ids) - n_prompt),
                "seq_len": len(ids),
                "n_prompt_tokens": n_prompt,
                "n_response_tokens": len(ids) - n_prompt,
                "has_reasoning": False,
                "finish_reason": "stop",
            }
        )
    return rows


def _write_tokenized(folder: Path, rows: list[dict], fp_json: Path, /, **override) -> Path:
    info = read_target_info(fp_json)
    tokens = folder / "00000.jsonl"
    write_jsonl(tokens, rows)
    meta = {
        "target_fingerprint": info.fingerprint,
        "tokenizer_fingerprint": info.tokenizer_fingerprint,
        "chat_template_sha256": info.chat_template_sha256,
        "rows": len(rows),
        "rejected": 0,
    }
    write_json(folder / "00000.meta.json", {**meta, **override})
    return tokens


@pytest.fixture(scope="module")
def rows(tokenizer):
    return _rows(tokenizer)


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory, rows, target_dir) -> Path:
    return _write_tokenized(tmp_path_factory.mktemp("tok"), rows, target_dir / "fingerprint.json")


def _extract(tokenized: Path, target_dir: Path, out: Path, **kw):
    files = ShardFiles(
        tokens=tokenized,
        meta=tokenized.with_name("00000.meta.json"),
        fingerprint=target_dir / "fingerprint.json",
        out=out,
    )
    runtime = Runtime(idle_s=kw.pop("share_idle_s", 0.0))
    settings = ExtractSettings(**{"batch_tokens": 64, "device": "cpu", "threads": None, **kw})
    return extract_shard(files, settings, runtime)


@pytest.fixture(scope="module")
def bf16_shard(tmp_path_factory, tokenized, target_dir) -> Path:
    out = tmp_path_factory.mktemp("hidden") / "00000.safetensors"
    _extract(tokenized, target_dir, out)
    return out


@pytest.fixture(scope="module")
def fp8_shard(tmp_path_factory, tokenized, target_dir) -> Path:
    out = tmp_path_factory.mktemp("hidden") / "00000.safetensors"
    _extract(tokenized, target_dir, out, storage="fp8")
    return out


@pytest.fixture(scope="module")
def reference(target_model, rows):
    """Unbatched `model(..., output_hidden_states=True)` per sample: (hidden_states, logits)."""
    out = []
    with torch.no_grad():
        for row in rows:
            res = target_model(torch.tensor([row["input_ids"]]), output_hidden_states=True)
            out.append(([h[0] for h in res.hidden_states], res.logits[0]))
    return out


def _token_shard(tokenized: Path):
    return read_token_shard(tokenized, vocab_size=49152)


# --- layer ids and batching -----------------------------------------------------------------


def test_no_layer_ids_configured_gives_the_eagle3_default_1_14_26():
    assert resolve_layer_ids([], 30) == LAYER_IDS
    assert resolve_layer_ids([2, 10, 20], 30) == [2, 10, 20]


@pytest.mark.parametrize("ids", [[1, 14], [1, 14, 30], [14, 1, 26], [1, 1, 26]])
def test_layer_ids_that_are_not_three_increasing_valid_ids_are_rejected(ids):
    with pytest.raises(ValueError, match="hidden.layer_ids"):
        resolve_layer_ids(ids, 30)


def test_batches_fit_the_token_budget_and_hold_every_sample_once():
    lengths = [5, 9, 3, 9, 20, 1, 7, 8, 10]
    batches = plan_forward_batches(lengths, batch_tokens=30)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        padded = len(b) * max(lengths[i] for i in b)
        assert padded <= 30 or len(b) == 1  # only an overlong sample may exceed, alone
    assert batches == plan_forward_batches(lengths, batch_tokens=30)  # deterministic
    assert [4] in batches  # the 20-token sample runs alone
    assert [8, 1, 3] in batches  # 10, 9, 9: ties keep input order; 8 would overflow 30


def test_batches_pad_at_most_a_fifth_of_their_tokens():
    lengths = [100, 95, 81, 79, 40, 33, 32]
    batches = plan_forward_batches(lengths, batch_tokens=10_000)
    assert batches == [[0, 1, 2], [3], [4, 5, 6]]  # 79 < 0.8 * 100; 32 >= 0.8 * 40
    for b in batches:
        longest = max(lengths[i] for i in b)
        assert sum(longest - lengths[i] for i in b) <= 0.2 * longest * len(b)


# --- features equal the target's hidden states ----------------------------------------------


def test_padded_batch_features_equal_unbatched_hidden_states_at_id_plus_one(
    target_model, rows, reference
):
    backend = HFFeatureBackend(target_model, LAYER_IDS)
    feats = backend.extract([r["input_ids"] for r in rows])  # right-padded to the longest
    for (aux, last), (hs, _) in zip(feats.split(), reference, strict=True):
        want_aux = torch.cat([hs[i + 1] for i in LAYER_IDS], dim=-1)
        torch.testing.assert_close(aux, want_aux, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(last, hs[-1], rtol=1e-4, atol=1e-4)


def test_stored_aux_and_last_equal_output_hidden_states_within_bf16(bf16_shard, reference):
    tensors, meta = read_shard(bf16_shard)
    assert json.loads(meta["layer_ids"]) == LAYER_IDS
    assert tensors["aux"].dtype == torch.bfloat16 and tensors["last"].dtype == torch.bfloat16
    off = tensors["offsets"].tolist()
    for i, (hs, _) in enumerate(reference):
        span = slice(off[i], off[i + 1])
        want_aux = torch.cat([hs[j + 1] for j in LAYER_IDS], dim=-1)
        # bf16 keeps 8 significant bits: relative rounding error <= 2**-9
        torch.testing.assert_close(
            dequantize_state(tensors, "aux")[span], want_aux, rtol=2**-8, atol=1e-3
        )
        torch.testing.assert_close(tensors["last"][span].float(), hs[-1], rtol=2**-8, atol=1e-3)


def test_lm_head_of_last_reproduces_the_target_logits(target_model, rows, reference, bf16_shard):
    backend = HFFeatureBackend(target_model, LAYER_IDS)
    tensors, _ = read_shard(bf16_shard)
    off = tensors["offsets"].tolist()
    with torch.no_grad():
        for i, (row, (_, logits)) in enumerate(zip(rows, reference, strict=True)):
            last = backend.extract([row["input_ids"]]).last
            torch.testing.assert_close(target_model.lm_head(last), logits, rtol=1e-4, atol=1e-3)
            stored = target_model.lm_head(tensors["last"][off[i] : off[i + 1]].float())
            assert torch.equal(stored.argmax(-1), logits.argmax(-1))


def test_shard_rows_and_metadata_match_the_tokenized_shard_and_target(
    bf16_shard, tokenized, rows, target_dir
):
    info = read_target_info(target_dir / "fingerprint.json")
    meta = verify_shard_file(
        bf16_shard,
        hidden_size=info.hidden_size,
        tokens=_token_shard(tokenized),
        expected_meta={"target_fingerprint": info.fingerprint},
    )
    tensors, _ = read_shard(bf16_shard)
    assert tensors["input_ids"].tolist() == [t for r in rows for t in r["input_ids"]]
    assert tensors["loss_mask"].tolist() == [m for r in rows for m in r["loss_mask"]]
    assert meta["tokenizer_fingerprint"] == info.tokenizer_fingerprint
    assert meta["backend"] == "hf" and meta["dtype"] == "bf16"
    assert meta["compute_dtype"] == "float32"  # what the engine computed in, not a config echo


def test_extracting_the_same_shard_again_gives_identical_tensors_and_metadata(
    tmp_path, tokenized, target_dir, bf16_shard
):
    # bytes may differ: safetensors writes the metadata map in no fixed order
    again = tmp_path / "again.safetensors"
    _extract(tokenized, target_dir, again)
    (t1, m1), (t2, m2) = read_shard(bf16_shard), read_shard(again)
    assert m1 == m2 and t1.keys() == t2.keys()
    assert all(torch.equal(t1[k], t2[k]) for k in t1)


# --- fp8 storage ----------------------------------------------------------------------------


def test_fp8_round_trip_error_is_bounded_by_each_token_and_layer_scale():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3 * 32, generator=g)
    # magnitudes spanning 1e-3..1e3 per token, and one all-zero token
    x *= torch.logspace(-3, 3, 64).unsqueeze(1)
    x[7] = 0
    q, scale = quantize_fp8(x, 3)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (64, 3)
    back = dequantize_fp8(q, scale)
    per_elem_scale = scale.repeat_interleave(32, dim=1)
    bound = x.abs() / 16 + per_elem_scale / 1024
    assert bool(((x - back).abs() <= bound * (1 + 1e-6)).all())
    assert torch.equal(back[7], torch.zeros(96))
    # the bound is not vacuous: relative error of large entries stays under 1/16
    big = x.abs() > per_elem_scale * 64
    assert float(((x - back).abs() / x.abs())[big].max()) <= 1 / 16


@pytest.fixture(scope="module")
def fp8_g64_shard(tmp_path_factory, tokenized, target_dir) -> Path:
    out = tmp_path_factory.mktemp("hidden") / "00000.safetensors"
    _extract(tokenized, target_dir, out, storage="fp8-g64")
    return out


@pytest.mark.parametrize("storage,groups", [("fp8", 1), ("fp8-g64", 576 // 64)])
def test_fp8_shards_halve_the_bytes_and_dequantize_close_to_bf16(
    storage, groups, fp8_shard, fp8_g64_shard, bf16_shard
):
    path = fp8_shard if storage == "fp8" else fp8_g64_shard
    t8, meta = read_shard(path)
    t16, _ = read_shard(bf16_shard)
    assert meta["dtype"] == "fp8"
    for key, layers in (("aux", 3), ("last", 1)):
        assert t8[key].dtype == torch.float8_e4m3fn
        scales = t8[f"{key}_scale"]
        assert scales.shape == (t8[key].shape[0], layers * groups)
        ref = dequantize_state(t16, key)
        scale = scales.repeat_interleave(576 // groups, dim=1)  # each element's own scale
        err = (dequantize_state(t8, key) - ref).abs()
        assert bool((err <= ref.abs() / 16 + scale / 1024 + ref.abs() * 2**-8).all()), key
    # 4H + 4 * 4 * groups + 5 bytes a token against 8H + 5 (H = 576)
    assert os.path.getsize(path) < (0.51 if groups == 1 else 0.54) * os.path.getsize(bf16_shard)


def test_storage_names_parse_and_a_group_not_dividing_h_stops_before_any_model_loads(
    tmp_path, tokenized, target_dir, monkeypatch
):
    assert parse_storage("bf16") == ("bf16", 0) and parse_storage("fp8") == ("fp8", 0)
    assert parse_storage("fp8-g64") == ("fp8", 64)
    for bad in ("fp16", "fp8-g0", "fp8-g", "bf16-g64", "fp8-64"):
        with pytest.raises(ValueError, match="hidden.storage"):
            parse_storage(bad)
    loaded = []
    monkeypatch.setattr("specbuild.engines.model.ModelSpec.load", lambda *a, **k: loaded.append(1))
    with pytest.raises(ValueError, match=r"hidden.storage fp8-g100: .* hidden size 576"):
        _extract(tokenized, target_dir, tmp_path / "00000.safetensors", storage="fp8-g100")
    assert not loaded and not list(tmp_path.iterdir())


# --- verification catches bad shards --------------------------------------------------------


def test_a_truncated_shard_is_rejected_naming_the_file(tmp_path, bf16_shard):
    bad = tmp_path / "00000.safetensors"
    data = bf16_shard.read_bytes()
    bad.write_bytes(data[: len(data) - 100])
    with pytest.raises(ShardError, match=r"(?s)00000\.safetensors.*truncated") as err:
        verify_shard_file(bad)
    assert "rerun" in str(err.value)


def test_a_shard_with_a_garbage_header_is_rejected(tmp_path):
    bad = tmp_path / "00003.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!" + b"\x00" * 32)
    with pytest.raises(ShardError, match=r"00003\.safetensors.*header"):
        read_shard(bad)


def test_a_changed_token_id_is_reported_with_its_sample(bf16_shard, tokenized):
    tensors, meta = read_shard(bf16_shard)
    off = tensors["offsets"].tolist()
    tensors["input_ids"][off[2] + 1] += 1
    with pytest.raises(ShardError, match=r"input_ids: 1 position\(s\) differ.*sample 2, id 's2'"):
        check_shard(tensors, meta, name="x.safetensors", tokens=_token_shard(tokenized))


def test_every_fault_is_listed_at_once(bf16_shard, tokenized):
    tensors, meta = read_shard(bf16_shard)
    tensors["last"][3, 5] = float("nan")
    tensors["aux"][0, 0] = float("inf")
    tensors["loss_mask"][0] = 1 - tensors["loss_mask"][0]
    meta = {**meta, "target_fingerprint": "0" * 64}
    with pytest.raises(ShardError) as err:
        check_shard(
            tensors,
            meta,
            name="results/hidden/d/00000.safetensors",
            tokens=_token_shard(tokenized),
            expected_meta={"target_fingerprint": "f" * 64},
        )
    msg = str(err.value)
    assert "results/hidden/d/00000.safetensors" in msg and "4 fault(s)" in msg
    for fault in ("last: 1 NaN/Inf", "aux: 1 NaN/Inf", "loss_mask: 1 position", "target_finger"):
        assert fault in msg


def test_shape_and_dtype_faults_are_reported(bf16_shard):
    tensors, meta = read_shard(bf16_shard)
    tensors["last"] = tensors["last"][:, :-1].float()
    tensors["offsets"] = tensors["offsets"][:-1]
    with pytest.raises(ShardError) as err:
        check_shard(tensors, meta, name="s", hidden_size=576)
    msg = str(err.value)
    assert "last: dtype torch.float32" in msg and "hidden size 575" in msg
    assert "offsets: must run from 0 to T" in msg


def test_a_backend_producing_nan_fails_the_job_and_publishes_nothing(
    tmp_path, tokenized, target_dir, monkeypatch
):
    class NaNBackend:
        name = "hf"
        device = torch.device("cpu")
        dtype = "float32"
        eagle_layer_ids = [1, 14, 26]

        def extract(self, batch):
            n = sum(map(len, batch))
            aux = torch.full((n, 3 * 576), float("nan"))
            return Features(aux, torch.zeros(n, 576), tuple(map(len, batch)))

    monkeypatch.setattr("specbuild.engines.model.ModelSpec.load", lambda *a, **k: NaNBackend())
    out = tmp_path / "00000.safetensors"
    with pytest.raises(ShardError, match=r"(?s)00000\.safetensors.*aux: \d+ NaN/Inf"):
        _extract(tokenized, target_dir, out)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("storage", ["bf16", "fp8", "fp8-g64"])
def test_the_size_estimate_matches_the_written_file(
    storage, bf16_shard, fp8_shard, fp8_g64_shard, tokenized
):
    path = {"bf16": bf16_shard, "fp8": fp8_shard, "fp8-g64": fp8_g64_shard}[storage]
    shard = _token_shard(tokenized)
    dtype, group = parse_storage(storage)
    estimate = shard_nbytes(
        tokens=shard.num_tokens,
        samples=len(shard),
        hidden_size=576,
        storage=dtype,
        fp8_group_size=group,
    )
    assert 0 < os.path.getsize(path) - estimate < 2048  # the safetensors header and metadata


def test_a_disk_too_small_stops_extraction_before_any_model_loads(
    tmp_path, tokenized, target_dir, monkeypatch
):
    # A real full disk cannot be made here: the filesystem reports 1 kB free.
    monkeypatch.setattr(
        "specbuild.infra.disk.shutil.disk_usage",
        lambda _: SimpleNamespace(total=10**4, used=9000, free=1000),
    )
    loaded = []
    monkeypatch.setattr("specbuild.engines.model.ModelSpec.load", lambda *a, **k: loaded.append(1))
    out = tmp_path / "00000.safetensors"
    with pytest.raises(
        OSError,
        match=r"(?s)00000\.safetensors: not enough free disk space.*needs ~[\d.]+ [MG]B"
        r".*hidden.storage: fp8",
    ):
        _extract(tokenized, target_dir, out)
    assert loaded == [] and list(tmp_path.iterdir()) == []


# --- the consistency gate -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "what"),
    [("tokenizer_fingerprint", "tokenizer"), ("chat_template_sha256", "chat template")],
)
def test_tokenizer_or_template_mismatch_stops_extraction_and_names_the_side_to_rebuild(
    tmp_path, rows, target_dir, key, what
):
    tok = _write_tokenized(tmp_path, rows, target_dir / "fingerprint.json", **{key: "ab" * 32})
    out = tmp_path / "h.safetensors"
    with pytest.raises(TokenizedShardError) as err:
        _extract(tok, target_dir, out)
    msg = str(err.value)
    assert "00000.meta.json" in msg and f"tokenized with {what} abababab" in msg
    assert "Rebuild the tokenized side" in msg and "forcerun generate tokenize" in msg
    assert not out.exists()


def test_a_bad_tokenized_row_is_reported_with_its_line(tmp_path, rows, target_dir):
    bad = [dict(r) for r in rows]
    bad[1]["loss_mask"] = bad[1]["loss_mask"][:-1]
    bad[2]["input_ids"] = [*bad[2]["input_ids"][:-1], 10**6]
    tok = _write_tokenized(tmp_path, bad, target_dir / "fingerprint.json")
    with pytest.raises(TokenizedShardError) as err:
        read_token_shard(tok, vocab_size=49152)
    msg = str(err.value)
    assert "2 bad row(s)" in msg and "line 2 (id s1)" in msg and "line 3 (id s2)" in msg


def test_the_gate_counts_rows_against_the_meta(tmp_path, rows, target_dir):
    tok = _write_tokenized(tmp_path, rows, target_dir / "fingerprint.json", rows=7)
    with pytest.raises(TokenizedShardError, match="rows: meta.json says 7, the shard holds 3"):
        _extract(tok, target_dir, tmp_path / "h.safetensors")
    assert read_json(tok.with_name("00000.meta.json"))["rows"] == 7


@pytest.mark.gpu
def test_cuda_bf16_extraction_stays_aligned_with_cpu_float32(target_dir, rows, reference):
    backend = HFFeatureBackend.from_folder(
        target_dir, layer_ids=LAYER_IDS, dtype="bfloat16", device="cuda"
    )
    feats = backend.extract([r["input_ids"] for r in rows])
    for (aux, last), (hs, _) in zip(feats.split(), reference, strict=True):
        want_aux = torch.cat([hs[i + 1] for i in LAYER_IDS], dim=-1)
        # bf16 compute drifts in value, not in direction: every token's state points the same way
        for got, want in ((aux.float().cpu(), want_aux), (last.float().cpu(), hs[-1])):
            cos = torch.nn.functional.cosine_similarity(got, want, dim=-1)
            assert float(cos.min()) > 0.98


def test_bench_fp8_measures_each_layers_error_and_smaller_groups_err_less(bf16_shard, target_dir):
    from benchmarks.fp8 import LAYER_NAMES, quantization_error

    got = quantization_error([bf16_shard], target_dir, ["fp8", "fp8-g64"])
    per_layer, grouped = got["storages"]["fp8"], got["storages"]["fp8-g64"]
    assert got["tokens"] == read_shard(bf16_shard)[0]["input_ids"].numel()
    for name in LAYER_NAMES:
        # e4m3's 3 mantissa bits: a few % relative error, never the scale's doing alone
        assert 0.005 < grouped[name]["rel_error"] < per_layer[name]["rel_error"] < 0.05, name
        assert per_layer[name]["cosine"] > 0.999, name
    assert 0.9 < per_layer["last"]["argmax_agreement"] <= 1.0
