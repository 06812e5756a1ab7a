"""A job's log file holds the traceback that killed the job, not only stderr."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _run_job(tmp_path, body: str) -> subprocess.CompletedProcess:
    """A script shaped like scripts/*.py: start the job's log, then the work."""
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from specbuild.infra.joblog import start_job_log

            start_job_log({str(tmp_path / "logs" / "job.log")!r})
            """
        )
        + textwrap.dedent(body)
    )
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True)


def test_an_uncaught_exception_is_written_to_the_jobs_log_file(tmp_path):
    proc = _run_job(
        tmp_path,
        """
        def extract():
            raise ValueError("shard 00003: 5 MB prompt")

        extract()
        """,
    )
    log = (tmp_path / "logs" / "job.log").read_text()
    assert proc.returncode == 1
    assert "CRITICAL job failed: ValueError: shard 00003: 5 MB prompt" in log
    assert "Traceback" in log and "in extract" in log
    assert proc.stderr.count("Traceback") == 1  # on stderr too, once


def test_a_fault_the_user_fixes_is_logged_as_its_message_alone(tmp_path):
    proc = _run_job(
        tmp_path,
        """
        from specbuild.hidden.shards import ShardError

        raise ShardError("1 of 2 hidden-state shard(s) failed verification\\nFix: delete it")
        """,
    )
    log = (tmp_path / "logs" / "job.log").read_text()
    assert proc.returncode == 1
    assert "CRITICAL job failed: 1 of 2 hidden-state shard(s) failed verification\nFix:" in log
    assert "Traceback" not in log and "Traceback" not in proc.stderr


def test_a_job_that_succeeds_logs_no_failure(tmp_path):
    proc = _run_job(tmp_path, "import logging\nlogging.getLogger('specbuild').info('done')\n")
    log = (tmp_path / "logs" / "job.log").read_text()
    assert proc.returncode == 0 and "done" in log and "failed" not in log


def test_every_script_starts_its_job_log_first():
    scripts = sorted((Path(__file__).resolve().parents[3] / "scripts").glob("*.py"))
    assert scripts
    missing = [s.name for s in scripts if "start_job_log(snakemake.log[0])" not in s.read_text()]
    assert missing == []


FULL_DISK_JOB = """
    import logging

    from specbuild.infra.io import write_jsonl

    log = logging.getLogger("specbuild")
    log.info("shard 00000: 12 records in")
    {fill}
    log.info("writing the shard")
    write_jsonl({out!r}, [{{"text": "x" * 1000}}] * 200)
    """


def _full_disk_output(proc) -> None:
    """A full disk ends the job with its short message alone on stderr."""
    assert proc.returncode == 1
    assert "CRITICAL job failed: " in proc.stderr
    assert "no space left on device" in proc.stderr
    assert "Logging error" not in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.count("this job logs to stderr only") == 1


def test_a_log_on_a_full_disk_leaves_the_short_message_alone(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "job.log").symlink_to("/dev/full")  # every write: ENOSPC
    body = FULL_DISK_JOB.format(fill="", out=str(tmp_path / "out" / "shard.jsonl"))
    script = f"""
    import errno
    import specbuild.infra.io

    def full(*args, **kwargs):  # the shard's disk is full as well
        raise OSError(errno.ENOSPC, "No space left on device")

    specbuild.infra.io._create_temp = full
    {textwrap.dedent(body)}
    """
    proc = _run_job(tmp_path, textwrap.dedent(script).replace("\n    ", "\n"))
    _full_disk_output(proc)
    assert "shard 00000: 12 records in" in proc.stderr  # what the log could not keep


@pytest.mark.root
def test_a_real_full_disk_under_logs_keeps_the_lines_written_before_it(tmp_path, mount_tmpfs):
    disk = mount_tmpfs("64k")  # logs/ and the output on one small real filesystem
    fill = f"open({str(disk / 'other-job.bin')!r}, 'wb').write(b'x' * 200_000)"
    body = FULL_DISK_JOB.format(
        fill=f"try:\n        {fill}\n    except OSError:\n        pass  # another job filled it\n"
        '    log.info("x" * 8192)  # past the log\'s last page',
        out=str(disk / "results" / "shard.jsonl"),
    )
    script = tmp_path / "job.py"
    script.write_text(
        "from specbuild.infra.joblog import start_job_log\n\n"
        f"start_job_log({str(disk / 'logs' / 'job.log')!r})\n" + textwrap.dedent(body)
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    _full_disk_output(proc)
    assert f"{disk / 'results' / 'shard.jsonl'}: no space left on device" in proc.stderr
    assert "shard 00000: 12 records in" in (disk / "logs" / "job.log").read_text()
    assert not (disk / "results" / "shard.jsonl").exists()
