"""Reading a materialized target: its fingerprint, its files as hashed, its tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest

from specbuild.eagle.target_info import (
    FINGERPRINT,
    TargetChangedError,
    TargetInfo,
    file_stats,
    load_tokenizer,
    read_target_info,
)


def test_reading_the_targets_facts_imports_neither_torch_nor_transformers():
    code = (
        "import sys\n"
        "import specbuild.eagle.target_info\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _fingerprinted(folder, **files: bytes):
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    info = TargetInfo(
        name="t",
        source="/src",
        fingerprint="f",
        weights_sha256="w",
        tokenizer_fingerprint="k",
        chat_template_sha256="c",
        num_hidden_layers=2,
        hidden_size=64,
        vocab_size=100,
        model_type="llama",
        files=file_stats(folder),
    )
    (folder / FINGERPRINT).write_text(json.dumps(asdict(info)))
    return info


def test_a_file_changed_added_or_removed_since_the_fingerprint_stops_the_reader(tmp_path):
    folder = tmp_path / "target"
    info = _fingerprinted(folder, **{"model.safetensors": b"abc", "config.json": b"{}"})
    assert "fingerprint.json" not in info.files  # the fingerprint does not describe itself
    assert read_target_info(folder / FINGERPRINT) == info
    (folder / "model.safetensors").write_bytes(b"abcd")
    with pytest.raises(TargetChangedError, match="model.safetensors changed") as err:
        read_target_info(folder / FINGERPRINT)
    assert "--forcerun target" in str(err.value) and "'/src'" in str(err.value)
    (folder / "model.safetensors").write_bytes(b"abc")
    (folder / "extra.json").write_text("{}")
    (folder / "config.json").unlink()
    with pytest.raises(TargetChangedError, match="config.json, extra.json changed"):
        read_target_info(folder / FINGERPRINT)


def test_a_fingerprint_written_before_files_were_recorded_is_read_unchecked(tmp_path):
    folder = tmp_path / "target"
    _fingerprinted(folder, **{"model.safetensors": b"abc"})
    old = json.loads((folder / FINGERPRINT).read_text())
    del old["files"], old["weights_hash"], old["trust_remote_code"], old["code_sha256"]
    (folder / FINGERPRINT).write_text(json.dumps(old))
    (folder / "model.safetensors").write_bytes(b"changed")
    info = read_target_info(folder / FINGERPRINT)
    assert (info.files, info.weights_hash, info.trust_remote_code) == ({}, "full", False)


def test_later_loads_pass_the_recorded_flag_and_never_prompt(kimi_layout_target, monkeypatch):
    import transformers.dynamic_module_utils as dyn

    def no_prompt(*args, **kwargs):
        raise AssertionError("transformers was about to ask on a terminal")

    monkeypatch.setattr("builtins.input", no_prompt)
    monkeypatch.setattr(dyn, "_raise_timeout_error", no_prompt, raising=False)
    tok = load_tokenizer(kimi_layout_target)  # the flag as fingerprint.json records it
    assert type(tok).__name__ == "KimiLayoutTokenizer"
    # without the flag transformers quietly falls back to its own class: why `target` refuses
    refused = load_tokenizer(kimi_layout_target, trust_remote_code=False)
    assert type(refused).__name__ != "KimiLayoutTokenizer"
