"""A full disk: refused before the work with the path, the need and the free space; a write
that fills it anyway names the file it was to become, in a few lines, and publishes nothing."""

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from specbuild.infra.disk import (
    BYTES_PER_GENERATED_TOKEN,
    CHECKPOINTS_AT_ONCE,
    TOKENIZE_EXPANSION,
    DiskFullError,
    ensure_free_space,
    export_need,
    generate_need,
    tokenize_need,
    train_need,
)
from specbuild.infra.io import atomic_open, write_jsonl

REPO = Path(__file__).resolve().parents[3]


def _free(monkeypatch, free: int) -> None:
    monkeypatch.setattr(
        "specbuild.infra.disk.shutil.disk_usage",
        lambda _: SimpleNamespace(total=10**12, used=10**12 - free, free=free),
    )


def test_too_little_space_is_refused_naming_path_need_and_free(tmp_path, monkeypatch):
    _free(monkeypatch, 500_000_000)
    out = tmp_path / "generated" / "00000.jsonl"
    with pytest.raises(DiskFullError) as err:
        ensure_free_space(out, 1_000_000_000, "a generated shard", hint="lower max_new_tokens")
    lines = str(err.value).splitlines()
    assert lines[0] == f"{out}: not enough free disk space for a generated shard"
    assert lines[1] == f"  needs ~1.05 GB, {out.parent} has 0.50 GB free"  # 5% to spare
    assert "a symlink to it works" in lines[2] and lines[3] == "  or lower max_new_tokens"
    assert len(lines) == 4 and err.value.errno == errno.ENOSPC
    assert list(out.parent.iterdir()) == []  # nothing written


def test_enough_space_passes_and_the_margin_is_five_percent(tmp_path, monkeypatch):
    _free(monkeypatch, 1_050_000_000)
    ensure_free_space(tmp_path / "x", 1_000_000_000, "x")  # exactly the need with margin
    with pytest.raises(DiskFullError):
        ensure_free_space(tmp_path / "x", 1_000_000_001, "x")


def test_the_check_reads_the_filesystem_through_statvfs_too(tmp_path, monkeypatch):
    # shutil.disk_usage is os.statvfs underneath: a filesystem reporting 4 free blocks
    real = os.statvfs(tmp_path)
    fake = os.statvfs_result((4096, 4096, 100, 4, 4, *tuple(real)[5:]))
    monkeypatch.setattr("shutil.os.statvfs", lambda _: fake)
    with pytest.raises(DiskFullError, match=r"needs ~1\.05 MB, .* has 0\.02 MB free"):
        ensure_free_space(tmp_path / "x", 1_000_000, "x")


def test_an_enospc_during_an_atomic_write_names_the_final_path_and_keeps_the_old_file(tmp_path):
    out = tmp_path / "shard.jsonl"
    out.write_text("old\n")

    with pytest.raises(DiskFullError) as err, atomic_open(out) as fh:
        fh.write("new")
        raise OSError(errno.ENOSPC, "No space left on device")
    first = str(err.value).splitlines()[0]
    assert first == f"{out}: no space left on device while writing it"
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert out.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "shard.jsonl"
    ]


def test_a_native_writers_full_disk_is_the_same_error(tmp_path):
    # safetensors words ENOSPC as its own exception: "... (os error 28)"
    with (
        pytest.raises(DiskFullError, match=r"x\.safetensors: no space left"),
        atomic_open(tmp_path / "x.safetensors", "wb"),
    ):
        raise RuntimeError("I/O error: No space left on device (os error 28)")


def test_other_errors_pass_through_unchanged(tmp_path):
    with pytest.raises(ValueError, match="not a disk problem"), atomic_open(tmp_path / "x"):
        raise ValueError("not a disk problem")


@pytest.fixture
def tiny_fs(mount_tmpfs):
    """A real 64 kB filesystem (tmpfs); root only."""
    return mount_tmpfs("64k")


@pytest.mark.root
def test_a_real_full_disk_fails_the_write_naming_it_and_leaves_nothing(tiny_fs):
    out = tiny_fs / "results" / "big.jsonl"
    rows = [{"text": "x" * 1000, "i": i} for i in range(200)]  # ~200 kB into 64 kB
    with pytest.raises(DiskFullError) as err:
        write_jsonl(out, rows)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{out}: no space left on device while writing it"
    assert "has " in lines[1] and len(lines) == 3
    assert list(out.parent.iterdir()) == []  # the temp file went too
    assert write_jsonl(out, rows[:10]) == 10  # the room came back


@pytest.mark.root
def test_the_check_sees_a_real_small_disk(tiny_fs):
    with pytest.raises(DiskFullError, match=r"needs ~0\.10 MB, .* has 0\.0\d MB free"):
        ensure_free_space(tiny_fs / "x.jsonl", 100_000, "x")
    ensure_free_space(tiny_fs / "x.jsonl", 10_000, "x")


def test_estimates_count_what_each_stage_writes(tmp_path):
    samples = tmp_path / "s.jsonl"
    samples.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(4)))
    size = samples.stat().st_size
    assert (
        generate_need(samples=samples, new_tokens=4 * 256)
        == size + 4 * 256 * BYTES_PER_GENERATED_TOKEN
    )
    # two answers a prompt: the prompts and their new tokens twice
    assert generate_need(samples=samples, new_tokens=0, copies=2) == 2 * size
    assert generate_need(samples=samples, new_tokens=256, copies=2) == 2 * (
        size + 256 * BYTES_PER_GENERATED_TOKEN
    )
    assert tokenize_need(generated=samples) == size * TOKENIZE_EXPANSION
    assert train_need(parameters=1000, trainable=600) == CHECKPOINTS_AT_ONCE * (4000 + 4800) + 4000
    ckpt = tmp_path / "best.safetensors"
    save_file({"w": torch.zeros(10, 10), "d2t": torch.zeros(7, dtype=torch.int64)}, ckpt)
    assert export_need(checkpoint=ckpt, dtype="bfloat16") == 100 * 2 + 7 * 8
    assert export_need(checkpoint=ckpt, dtype="float32") == 100 * 4 + 7 * 8


def test_every_stage_that_writes_much_checks_free_space_first():
    # the stages whose outputs scale with the data or the model
    where = {
        "generate": "src/specbuild/generate.py",
        "tokenize": "src/specbuild/tokenization.py",
        "hidden": "src/specbuild/hidden/core.py",
        "train": "src/specbuild/drafter/state.py",  # ensure_state_space, before the first step
        "export": "src/specbuild/export.py",
    }
    unchecked = [s for s, f in where.items() if "ensure_free_space(" not in (REPO / f).read_text()]
    assert unchecked == []


def _run_job(tmp_path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(
        "from specbuild.infra.joblog import start_job_log\n"
        f"start_job_log({str(tmp_path / 'job.log')!r})\n" + textwrap.dedent(body)
    )
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True)


def test_a_job_ending_on_a_full_disk_prints_the_message_alone(tmp_path, monkeypatch):
    proc = _run_job(
        tmp_path,
        f"""
        import shutil
        from types import SimpleNamespace
        shutil.disk_usage = lambda _: SimpleNamespace(total=1, used=1, free=1000)
        from specbuild.infra.disk import ensure_free_space
        ensure_free_space({str(tmp_path / "out.jsonl")!r}, 10**9, "a tokenized shard")
        """,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 3
    assert f"job failed: {tmp_path / 'out.jsonl'}: not enough free disk space" in proc.stderr
    assert "needs ~1.05 GB" in (tmp_path / "job.log").read_text()


def test_ctrl_c_ends_a_job_in_one_line(tmp_path):
    proc = _run_job(
        tmp_path,
        """
        def work():
            raise KeyboardInterrupt

        work()
        """,
    )
    assert proc.returncode != 0  # killed by SIGINT, as Snakemake expects
    assert "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith("job interrupted (Ctrl-C): nothing it was writing kept its name")
    )
    assert len(proc.stderr.strip().splitlines()) == 1


def test_generate_refuses_a_too_small_disk_before_any_model_loads(
    tmp_path, target_dir, monkeypatch
):
    from specbuild.backends import SamplingParams
    from specbuild.generate import GenerateSettings, generate_shard
    from specbuild.rejects import ShardFiles

    samples = tmp_path / "s.jsonl"
    rows = [{"id": f"d-{i}", "messages": [{"role": "user", "content": "Hi"}]} for i in range(4)]
    write_jsonl(samples, rows)
    _free(monkeypatch, 10_000)  # 4 samples x 256 tokens x 16 bytes do not fit
    loaded = []
    out = tmp_path / "out" / "g.jsonl"
    with pytest.raises(DiskFullError) as err:
        generate_shard(
            samples=samples,
            fingerprint=target_dir / "fingerprint.json",
            files=ShardFiles(
                out=out, rejected=tmp_path / "out" / "r.jsonl", counts=tmp_path / "out" / "c.json"
            ),
            backend=lambda: loaded.append(1),
            settings=GenerateSettings(
                mode="regenerate", sampling=SamplingParams(max_new_tokens=256), batch_size=4
            ),
        )
    need = (samples.stat().st_size + 4 * 256 * BYTES_PER_GENERATED_TOKEN) * 1.05 / 1e6
    assert str(err.value).splitlines()[:2] == [
        f"{out}: not enough free disk space for a generated shard",
        f"  needs ~{need:.2f} MB, {out.parent} has 0.01 MB free",
    ]
    assert "lower generate.max_new_tokens" in str(err.value)
    assert loaded == [] and list(out.parent.iterdir()) == []


def test_the_training_need_counts_what_a_checkpoint_saves_not_the_frozen_embedding():
    from specbuild.drafter.config import DrafterConfig
    from specbuild.drafter.model import Eagle3Drafter

    model = Eagle3Drafter(
        DrafterConfig(
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=1000,
            draft_vocab_size=100,
            target_hidden_size=64,
        )
    )
    saved = model.export_state()
    parameters = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for b in model.buffers() if b.numel() and b.dtype != torch.float32)
    # the target's embedding is loaded, never saved; the vocabulary maps are saved
    assert "embed_tokens.weight" not in saved
    assert sum(t.numel() for t in saved.values()) == parameters - 1000 * 64 + buffers
