"""A stale Snakemake lock is removed only when no snakemake process works in the directory:
`python -m specbuild.run_lock -- UNLOCK...` runs the unlock command after a killed run and
refuses, naming the process, while a run is live."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from specbuild.run_lock import is_snakemake_process, lock_holders, main


def _locked_dir(path: Path) -> Path:
    locks = path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("results/a\n")
    (locks / "0.output.lock").write_text("results/b\n")
    return path


def _unlock_command(path: Path) -> list[str]:
    """Stands in for `snakemake --unlock`: leaves a mark when it runs."""
    return ["--", sys.executable, "-c", f"open({str(path / 'unlocked')!r}, 'w')"]


def _fake_snakemake(tmp_path: Path, cwd: Path) -> subprocess.Popen:
    """A live process that looks like `python .venv/bin/snakemake ...` working in `cwd`."""
    exe = tmp_path / "bin" / "snakemake"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text("import time\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, str(exe), "--cores", "1"], cwd=cwd)
    time.sleep(0.3)  # its /proc entry shows the final command line
    return proc


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/w/.venv/bin/python3", "/w/.venv/bin/snakemake", "--cores", "2"], True),
        (["snakemake", "-n"], True),
        (["python", "-m", "snakemake", "--unlock"], True),
        (["/w/.venv/bin/python3", "/w/.snakemake/scripts/tmpa1b2.train.py"], True),
        (["vim", "Snakefile"], False),
        (["/bin/sh", "-c", "if true; then .venv/bin/snakemake --unlock; fi"], False),
        (["python", "-m", "specbuild.run_lock", "--", "snakemake", "--unlock"], False),
    ],
)
def test_snakemake_processes_and_their_jobs_are_recognised(argv, expected):
    assert is_snakemake_process(argv) is expected


def test_an_unlocked_directory_is_left_alone(tmp_path):
    assert main(["--directory", str(tmp_path), *_unlock_command(tmp_path)]) == 0
    assert not (tmp_path / "unlocked").exists()


def test_a_lock_no_live_run_holds_is_removed(tmp_path):
    work = _locked_dir(tmp_path / "work")
    other = tmp_path / "elsewhere"
    other.mkdir()
    proc = _fake_snakemake(tmp_path, cwd=other)  # a run in another directory does not count
    try:
        assert lock_holders(work) == []
        assert main(["--directory", str(work), *_unlock_command(tmp_path)]) == 0
    finally:
        proc.kill()
        proc.wait()
    assert (tmp_path / "unlocked").exists()


def test_a_live_run_keeps_its_lock_and_is_named(tmp_path, capsys):
    work = _locked_dir(tmp_path / "work")
    proc = _fake_snakemake(tmp_path, cwd=work)
    try:
        assert [h.pid for h in lock_holders(work)] == [proc.pid]
        assert main(["--directory", str(work), *_unlock_command(tmp_path)]) == 1
    finally:
        proc.kill()
        proc.wait()
    assert not (tmp_path / "unlocked").exists()
    assert f"pid {proc.pid}" in capsys.readouterr().out
    # once it is gone (killed, reaped), the same call removes the lock
    assert main(["--directory", str(work), *_unlock_command(tmp_path)]) == 0
    assert (tmp_path / "unlocked").exists()


def test_lock_advice_says_the_safe_unlock_for_a_stale_lock_and_waits_for_a_live_one(tmp_path):
    from specbuild.run_lock import SAFE_UNLOCK, lock_advice

    assert lock_advice(tmp_path) is None
    work = _locked_dir(tmp_path / "work")
    stale = lock_advice(work)
    assert stale.endswith(f"No run is live (a killed run left it): {SAFE_UNLOCK}")
    proc = _fake_snakemake(tmp_path, cwd=work)
    try:
        live = lock_advice(work)
    finally:
        proc.kill()
        proc.wait()
    assert f"A live run holds it (pid {proc.pid})" in live
    assert "Do not run snakemake --unlock now" in live
