"""A job's log file holds the traceback that killed the job, not only stderr."""

import subprocess
import sys
import textwrap
from pathlib import Path


def _run_job(tmp_path, body: str) -> subprocess.CompletedProcess:
    """A script shaped like scripts/*.py: start the job's log, then the work."""
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from specbuild.joblog import start_job_log

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


def test_a_job_that_succeeds_logs_no_failure(tmp_path):
    proc = _run_job(tmp_path, "import logging\nlogging.getLogger('specbuild').info('done')\n")
    log = (tmp_path / "logs" / "job.log").read_text()
    assert proc.returncode == 0 and "done" in log and "failed" not in log


def test_every_script_starts_its_job_log_first():
    scripts = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))
    assert scripts
    missing = [s.name for s in scripts if "start_job_log(snakemake.log[0])" not in s.read_text()]
    assert missing == []
