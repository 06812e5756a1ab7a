"""Pid files (specbuild.infra.pidfile): a pid names a process only with its start time, so a
pid file of the older format (a pid alone) or one whose process exited and whose pid went to
another process names none."""

from __future__ import annotations

import os
import subprocess

from specbuild.infra.pidfile import ProcessId, live_pid, read_pid_file, write_pid_file
from specbuild.infra.run_lock import process_start


def test_a_pid_file_names_its_process_while_that_very_process_runs(tmp_path):
    child = subprocess.Popen(["sleep", "600"])
    path = tmp_path / "keeper.pid"
    try:
        write_pid_file(path, child.pid)
        assert read_pid_file(path) == ProcessId(child.pid, process_start(child.pid))
        assert live_pid(path) == child.pid
    finally:
        child.kill()
        child.wait()
    assert live_pid(path) is None


def test_a_pid_alone_or_a_reused_pid_names_no_process(tmp_path):
    me = os.getpid()  # a live process, standing for whatever got a dead keeper's pid
    path = tmp_path / "keeper.pid"
    path.write_text(f"{me}\n")  # the older format
    assert read_pid_file(path) is None and live_pid(path) is None
    path.write_text(f"{me} {process_start(me) + 1}\n")  # another process had the pid then
    assert live_pid(path) is None
    for junk in ("", "abc", f"{me} x", f"{me} 1 2"):
        path.write_text(junk)
        assert live_pid(path) is None, junk
    assert live_pid(tmp_path / "absent.pid") is None
