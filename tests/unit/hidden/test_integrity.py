"""Hidden-shard integrity (hidden/integrity.py, and the shard checks of hidden/shards.py built
on it): `write_shard` records checksums, `verify_shard_file` finds every
changed byte from the file alone (flipped aux, last or input_ids bytes that stay finite, a
truncated file, a garbage or a valid-but-wrong header), naming the file and the fix.

Shards here are tiny (5 samples, H=8) and written by the real writer.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specbuild.drafter.data import ShardSet, check_verified, verify_shards
from specbuild.hidden.fp8 import quantize_fp8
from specbuild.hidden.integrity import CHECKSUM_KEY, ST_DTYPES, TORCH_DTYPES
from specbuild.hidden.shards import (
    SHARD_KEYS,
    ShardError,
    read_header,
    read_shard,
    shard_file_faults,
    verify_shard_file,
    write_shard,
)
from specbuild.hidden.writer import shard_writer

H = 8
META = {
    "layer_ids": "[1, 2, 4]",
    "backend": "hf",
    "target_fingerprint": "t" * 64,
    "tokenizer_fingerprint": "k" * 64,
    "specbuild_version": "0.1.0",
}


def _tensors(storage: str = "bf16", seed: int = 0) -> dict[str, torch.Tensor]:
    """A shard's tensors: storage bf16, fp8 (a scale per token and layer), fp8-g4 (a scale per
    4 channels) or fp8-legacy (aux fp8, last bf16: the layout before `last` went fp8)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 7, 4, 9, 5]
    T = sum(lengths)
    aux = torch.randn(T, 3 * H, generator=g)
    last = torch.randn(T, H, generator=g)
    out = {
        "input_ids": torch.randint(0, 100, (T,), generator=g, dtype=torch.int32),
        "loss_mask": (torch.arange(T) % 3 != 0).to(torch.uint8),
        "offsets": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]),
        "aux": aux.bfloat16(),
        "last": last.bfloat16(),
    }
    if storage.startswith("fp8"):
        groups = 2 if storage == "fp8-g4" else 1  # scales per token and layer
        out["aux"], out["aux_scale"] = quantize_fp8(aux, 3 * groups)
        if storage != "fp8-legacy":
            out["last"], out["last_scale"] = quantize_fp8(last, groups)
    return out


def _write(path: Path, storage: str = "bf16") -> Path:
    dtype = storage.split("-")[0]  # the metadata names the dtype, not the scale layout
    write_shard(path, _tensors(storage), META | {"dtype": dtype})
    return path


def _data_span(path: Path, name: str) -> tuple[int, int]:
    """Byte range of tensor `name` in the file."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8 : 8 + n])[name]["data_offsets"]
    return 8 + n + begin, 8 + n + end


def _flip_low_bits(path: Path, name: str, nbytes: int = 4096) -> None:
    """XOR the lowest bit of up to `nbytes` bytes of a tensor, mtime aside: for bf16 that flips
    the last mantissa bit of every value, so every value stays finite."""
    begin, end = _data_span(path, name)
    raw = bytearray(path.read_bytes())
    for i in range(begin, min(end, begin + nbytes), 2 if name in ("aux", "last") else 1):
        raw[i] ^= 0x01
    path.write_bytes(bytes(raw))


def test_write_shard_records_a_checksum_of_every_tensor_and_a_sound_file_verifies(tmp_path):
    path = _write(tmp_path / "d" / "00000.safetensors")
    meta = verify_shard_file(path, hidden_size=H)
    recorded = json.loads(meta[CHECKSUM_KEY])
    assert recorded["algorithm"] == "sha256-16MiB" and set(recorded["tensors"]) == set(SHARD_KEYS)
    assert shard_file_faults(path, hidden_size=H)[0] == []


def _corrupt_aux(p):
    _flip_low_bits(p, "aux")


def _corrupt_last(p):
    _flip_low_bits(p, "last")


def _corrupt_input_ids(p):
    _flip_low_bits(p, "input_ids", nbytes=1)


def _truncate(p):
    p.write_bytes(p.read_bytes()[:-100])


def _garbage_header(p):
    raw = bytearray(p.read_bytes())
    raw[8:40] = b"x" * 32
    p.write_bytes(bytes(raw))


def _wrong_header(p):
    # still a valid safetensors file: `last` claims shape [56, 4] instead of [28, 8]
    raw = p.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = raw[8 : 8 + n].decode()
    wrong = re.sub(r'("last":\{"dtype":"BF16","shape":)\[28,8\]', r"\1[56,4]", header)
    assert wrong != header and len(wrong) == len(header)
    p.write_bytes(raw[:8] + wrong.encode() + raw[8 + n :])


@pytest.mark.parametrize(
    "corrupt, fault",
    [
        (_corrupt_aux, "aux: checksum mismatch"),
        (_corrupt_last, "last: checksum mismatch"),
        (_corrupt_input_ids, "input_ids: checksum mismatch"),
        (_truncate, "truncated"),
        (_garbage_header, "no valid safetensors header"),
        (_wrong_header, "header: tensor names, dtypes, shapes or metadata changed"),
    ],
    ids=["aux", "last", "input_ids", "truncated", "garbage-header", "wrong-header"],
)
def test_every_changed_byte_fails_verification_naming_the_file_the_fault_and_the_fix(
    tmp_path, corrupt, fault
):
    path = _write(tmp_path / "d" / "00003.safetensors")
    corrupt(path)
    with pytest.raises(ShardError) as err:
        verify_shard_file(path, hidden_size=H)
    msg = str(err.value)
    assert msg.startswith(str(path)) and fault in msg
    assert f"snakemake --forcerun {path}" in msg
    assert "NaN" not in msg  # caught by the checksum or the header, not by luck


@pytest.mark.parametrize("name", ["aux", "last", "input_ids", "offsets"])
def test_read_shard_checks_the_checksums_of_what_it_loaded(tmp_path, name):
    path = _write(tmp_path / "00001.safetensors")
    read_shard(path)
    _flip_low_bits(path, name, nbytes=2)
    with pytest.raises(ShardError, match=rf"(?s)00001\.safetensors: .*{name}: checksum mismatch"):
        read_shard(path)


@pytest.mark.parametrize("name", ["aux", "last", "last_scale"])
def test_a_flipped_fp8_byte_fails_verification(tmp_path, name):
    path = _write(tmp_path / "00000.safetensors", storage="fp8")
    verify_shard_file(path, hidden_size=H)
    _flip_low_bits(path, name, nbytes=1)
    with pytest.raises(ShardError, match=f"{name}: checksum mismatch"):
        verify_shard_file(path, hidden_size=H)


@pytest.mark.parametrize("storage", ["fp8", "fp8-g4", "fp8-legacy"])
def test_fp8_shards_verify_and_read_back_close_to_their_float_values(tmp_path, storage):
    """Every fp8 layout verifies and the trainer's reader returns aux and last within e4m3's
    error of the float values; the legacy one (aux-only fp8) keeps its bf16 last."""
    path = _write(tmp_path / "hidden" / "d" / "00000.safetensors", storage)
    meta = verify_shard_file(path, hidden_size=H)
    assert meta["dtype"] == "fp8"
    data = ShardSet([path], hidden_size=H)
    ref = _tensors("bf16")  # the same seed: the values before quantization (as bf16)
    for r in data.refs:
        sample = data.load(r, max_length=64)
        for key in ("aux", "last"):
            want = ref[key][r.start : r.end].float()
            got = sample[key]
            if storage == "fp8-legacy" and key == "last":
                assert got.dtype == torch.bfloat16 and torch.equal(got.float(), want)
            else:
                assert got.dtype == torch.float32  # dequantized
                # |x - x'| <= |x| / 16 + scale / 1024 (fp8.py), scale <= max |x| / 448
                bound = want.abs() / 16 + want.abs().amax() / 448 / 1024 + want.abs() * 2**-8
                assert bool(((got - want).abs() <= bound).all()), key


def test_an_fp8_shard_whose_scales_disagree_with_its_states_fails_naming_each(tmp_path):
    tensors = _tensors("fp8")
    cases = {
        "missing tensor 'last_scale'": {k: v for k, v in tensors.items() if k != "last_scale"},
        r"last_scale: shape \(28, 2\), expected \[28, 1\]": tensors
        | {"last_scale": tensors["last_scale"].repeat(1, 2)},
        r"aux_scale: shape \(28, 4\), expected \[28, 3G\] with G dividing H=8": tensors
        | {"aux_scale": torch.ones(28, 4)},
        "last_scale: non-positive scale": tensors | {"last_scale": -tensors["last_scale"]},
        r"last: dtype torch.bfloat16, expected torch.float8_e4m3fn": tensors
        | {"last": tensors["last"].float().bfloat16()},
    }
    for i, (fault, bad) in enumerate(cases.items()):
        path = tmp_path / f"{i:05d}.safetensors"
        write_shard(path, bad, META | {"dtype": "fp8"})
        with pytest.raises(ShardError, match=rf"(?s){i:05d}\.safetensors.*{fault}"):
            verify_shard_file(path, hidden_size=H)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_the_word_wide_nan_test_sees_every_non_finite_bit_pattern_in_every_lane(dtype):
    from specbuild.hidden.integrity import count_nonfinite

    bits = 8 * dtype.itemsize
    patterns = torch.arange(2**bits, dtype=torch.int32).to(
        torch.int16 if bits == 16 else torch.uint8
    )
    patterns = patterns.view(dtype)
    bad = patterns[~torch.isfinite(patterns.float())]  # 256 for bf16 (NaN, +-Inf), 2 for fp8
    finite = patterns[torch.isfinite(patterns.float())]
    lanes = 8 // dtype.itemsize
    assert count_nonfinite(finite) == 0
    for value in bad:
        for lane in range(lanes):  # one non-finite value among finite ones, at each position
            word = torch.zeros(4 * lanes, dtype=dtype)
            word[lane + lanes] = value
            assert count_nonfinite(word) == 1


def test_nan_written_into_a_shard_is_counted_from_the_file_in_each_tensor(tmp_path):
    tensors = _tensors()
    tensors["aux"][2, 3] = float("nan")
    tensors["last"][4] = float("inf")
    path = tmp_path / "00000.safetensors"
    write_shard(path, tensors, META | {"dtype": "bf16"})  # checksums agree: the values are bad
    faults, _ = shard_file_faults(path, hidden_size=H)
    assert faults == ["aux: 1 NaN/Inf value(s)", f"last: {H} NaN/Inf value(s)"]


def test_a_shard_without_checksums_gets_every_other_check_and_is_reported_unchecked(tmp_path):
    old = tmp_path / "d" / "00000.safetensors"
    old.parent.mkdir()
    save_file(_tensors(), str(old), metadata=META | {"dtype": "bf16"})  # before checksums
    good = _write(tmp_path / "d" / "00001.safetensors")
    broken, unchecked = verify_shards([old, good], hidden_size=H)
    assert broken == {} and unchecked == [str(old)]
    tensors, meta = read_shard(old)
    tensors["last"][0, 0] = float("nan")
    save_file(tensors, str(old), metadata=meta)
    broken, _ = verify_shards([old, good], hidden_size=H)
    assert broken == {str(old): ["last: 1 NaN/Inf value(s)"]}


def test_ranks_split_the_shards_and_one_error_lists_every_broken_one(tmp_path):
    paths = [_write(tmp_path / "d" / f"{i:05d}.safetensors") for i in range(4)]
    _flip_low_bits(paths[1], "aux")
    _truncate(paths[2])
    shares = [verify_shards(paths, hidden_size=H, rank=r, world_size=2) for r in range(2)]
    assert set(shares[0][0]) == {str(paths[2])} and set(shares[1][0]) == {str(paths[1])}
    with pytest.raises(ShardError) as err:
        check_verified(shares[0][0] | shares[1][0], total=4)
    msg = str(err.value)
    assert msg.startswith("2 of 4 hidden-state shard(s) failed verification")
    assert f"snakemake --forcerun {paths[1]} {paths[2]}" in msg
    assert str(paths[0]) not in msg and str(paths[3]) not in msg


def test_the_writer_reads_back_its_header_and_checksums(tmp_path):
    path = _write(tmp_path / "00000.safetensors")
    header, meta = read_header(path)
    assert header["aux"] == ("BF16", [28, 3 * H]) and CHECKSUM_KEY in meta
    # writing read tensors again (another shard's metadata) recomputes, never copies, checksums
    tensors, meta = read_shard(path)
    tensors["input_ids"][0] += 1
    again = tmp_path / "00001.safetensors"
    write_shard(again, tensors, meta)
    verify_shard_file(again, hidden_size=H)
    assert read_header(again)[1][CHECKSUM_KEY] != meta[CHECKSUM_KEY]


def test_a_shard_of_specbuild_0_1_with_whole_tensor_sha256_still_verifies(tmp_path):
    # the 0.1 format: one sha256 over each tensor's bytes; a flipped byte must still be found
    tensors = _tensors()
    layout = {k: [ST_DTYPES[v.dtype], list(v.shape)] for k, v in tensors.items()}
    meta = META | {"dtype": "bf16"}
    blob = json.dumps({"tensors": layout, "metadata": meta}, sort_keys=True)
    recorded = {
        "algorithm": "sha256",
        "tensors": {
            k: hashlib.sha256(v.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
            for k, v in tensors.items()
        },
        "layout": hashlib.sha256(blob.encode()).hexdigest(),
    }
    path = tmp_path / "00000.safetensors"
    save_file(tensors, str(path), metadata=meta | {CHECKSUM_KEY: json.dumps(recorded)})
    verify_shard_file(path, hidden_size=H)
    read_shard(path)
    _flip_low_bits(path, "last", nbytes=2)
    with pytest.raises(ShardError, match="last: checksum mismatch"):
        verify_shard_file(path, hidden_size=H)


def test_a_byte_changed_in_a_later_16_mib_piece_of_a_tensor_is_found(tmp_path):
    # aux of 3 pieces: each piece is hashed on its own, and all of them count
    T = (40 << 20) // (3 * H * 2)
    tensors = {
        "input_ids": torch.zeros(T, dtype=torch.int32),
        "loss_mask": torch.ones(T, dtype=torch.uint8),
        "offsets": torch.tensor([0, T]),
        "aux": torch.ones(T, 3 * H, dtype=torch.bfloat16),
        "last": torch.ones(T, H, dtype=torch.bfloat16),
    }
    path = tmp_path / "00000.safetensors"
    write_shard(path, tensors, META | {"dtype": "bf16"})
    verify_shard_file(path, hidden_size=H)
    begin, end = _data_span(path, "aux")
    with open(path, "r+b") as fh:
        fh.seek(begin + (33 << 20))  # the third piece
        fh.write(b"\x01")
    with pytest.raises(ShardError, match="aux: checksum mismatch"):
        verify_shard_file(path, hidden_size=H)


def test_the_writer_lays_tensors_out_aligned_and_safetensors_loads_them(tmp_path):
    tensors = _tensors("fp8")
    path = tmp_path / "00000.safetensors"
    write_shard(path, tensors, META | {"dtype": "fp8"})
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert (8 + n) % 8 == 0  # the data section starts 8-byte aligned
    header = json.loads(raw[8 : 8 + n])
    for name, entry in header.items():
        if name != "__metadata__":
            assert entry["data_offsets"][0] % TORCH_DTYPES[entry["dtype"]].itemsize == 0
    loaded = load_file(str(path))  # safetensors' own reader
    assert loaded.keys() == tensors.keys()
    for key, value in tensors.items():
        assert torch.equal(loaded[key].view(torch.uint8), value.view(torch.uint8))


@pytest.mark.parametrize("how", ["error", "unsealed"])
def test_a_writer_block_that_fails_or_never_seals_leaves_no_file(tmp_path, how):
    path = tmp_path / "00000.safetensors"
    tensors = _tensors()
    layout = {k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()}
    with pytest.raises((RuntimeError, KeyError)):
        with shard_writer(path, layout, META | {"dtype": "bf16"}) as w:
            w.tensors["aux"].copy_(tensors["aux"])
            if how == "error":
                raise KeyError("a backend failed mid-shard")
    assert list(tmp_path.iterdir()) == []


def test_pieces_marked_as_they_land_hash_like_a_scan_of_the_whole_and_gaps_are_refused(tmp_path):
    from specbuild.hidden.integrity import PieceScan, scan_tensors

    data = torch.randint(0, 255, (3 * (16 << 20) + 5,), dtype=torch.uint8)
    early = PieceScan({"x": data})
    for start, stop in [(40 << 20, data.numel()), (0, 1), (1, 17 << 20), (17 << 20, 40 << 20)]:
        early.landed("x", start, stop)  # out of order, across piece borders
    assert early.result().digests == scan_tensors({"x": data}).digests
    gap = PieceScan({"x": data})
    gap.landed("x", 0, 100)
    with pytest.raises(RuntimeError, match="x: some bytes written never"):
        gap.result()
