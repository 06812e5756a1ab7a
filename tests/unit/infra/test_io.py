"""Atomic writes: a failed block publishes nothing, and outputs get the user's file mode."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from safetensors.torch import save_file

from specbuild.drafter.state import TrainState, save_checkpoint, save_drafter
from specbuild.infra.io import atomic_open, atomic_path, user_file_mode, write_json, write_jsonl


@pytest.fixture(params=[0o022, 0o002], ids=["umask022", "umask002"])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_every_atomic_writer_gives_0666_less_the_umask(tmp_path, umask):
    want = 0o666 & ~umask  # 0644 or 0664: what `touch` gives, never mkstemp's 0600
    write_json(tmp_path / "a.json", {"a": 1})
    write_jsonl(tmp_path / "b.jsonl", [{"b": 2}])
    with atomic_open(tmp_path / "c.bin", "wb") as fh:
        fh.write(b"c")
    with atomic_path(tmp_path / "d.safetensors") as tmp:  # save_file itself writes 0600
        save_file({"d": torch.zeros(2)}, str(tmp))
    save_drafter(tmp_path / "best.safetensors", {"w": torch.ones(2)}, {"step": 1})
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    ckpt = save_checkpoint(
        tmp_path / "state", job="j", state=TrainState(), model=model.state_dict(), optimizer=opt
    )
    written = (
        [tmp_path / n for n in ("a.json", "b.jsonl", "c.bin", "d.safetensors", "best.safetensors")]
        + sorted(ckpt.iterdir())
        + [tmp_path / "state" / "latest.json"]
    )
    assert {p.name: oct(_mode(p)) for p in written} == {p.name: oct(want) for p in written}
    assert user_file_mode(tmp_path) == want
    assert not list(tmp_path.glob(".*.tmp"))  # no temp file left behind


def test_a_failed_block_publishes_nothing_and_keeps_the_old_file(tmp_path):
    out = tmp_path / "x.json"
    write_json(out, {"v": 1})
    with pytest.raises(RuntimeError), atomic_open(out) as fh:
        fh.write('{"v": 2')
        raise RuntimeError("killed")
    assert out.read_text() == '{\n  "v": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_a_target_folder_linked_from_the_source_leaves_the_source_modes_alone(
    tmp_path, target_dir, umask
):
    from specbuild.target import materialize_target

    src = tmp_path / "src"
    src.mkdir()
    for f in target_dir.iterdir():
        if f.is_file() and f.name not in ("fingerprint.json", "model.safetensors"):
            (src / f.name).write_bytes(f.read_bytes())
    # a one-tensor weights file: the modes are the point, not the 540 MB copy of SmolLM2's
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, str(src / "model.safetensors"))
    os.chmod(src / "model.safetensors", 0o640)  # the user's choice for their own file
    out = tmp_path / "out"
    materialize_target(source=str(src), name="t", out_dir=out)
    # out/model.safetensors is a hard link to the source: chmod-ing it would change theirs
    assert os.path.samefile(out / "model.safetensors", src / "model.safetensors")
    assert _mode(src / "model.safetensors") == 0o640
    assert _mode(out / "fingerprint.json") == 0o666 & ~umask


def test_a_dead_writers_temp_file_goes_at_the_next_write(tmp_path, caplog):
    """A killed job's half-written temp (a shard: gigabytes) is removed when the rerun writes
    the same file; a live writer's, another file's and another host's are left alone."""
    import subprocess
    import sys

    from specbuild.infra import io

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        out = tmp_path / "00000.safetensors"
        stale = tmp_path / f".{out.name}.{io._HOST}-{dead.pid}-0badf00d.tmp"
        busy = tmp_path / f".{out.name}.{io._HOST}-{live.pid}-0badf00d.tmp"
        elsewhere = tmp_path / f".{out.name}.ffffffff-{dead.pid}-0badf00d.tmp"
        other = tmp_path / f".00001.safetensors.{io._HOST}-{dead.pid}-0badf00d.tmp"
        for p in (stale, busy, elsewhere, other):
            p.write_bytes(b"half a shard")
        write_json(out, {"v": 1})
        assert not stale.exists()
        assert busy.exists() and elsewhere.exists() and other.exists()
        assert f"removed {stale} (12 bytes)" in caplog.text
    finally:
        live.kill()
        live.wait()
