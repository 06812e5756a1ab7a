"""A config file that would run code is refused before it runs, by the real `snakemake` and by
`make` alike (profiles/default reads every --configfile as plain data first); without that
profile the Snakefile refuses it too, after Snakemake's own loader has run it (docs/security.md
says which route covers what). A file a loader would misread (a repeated key, a key YAML reads
as no string) or that is missing is one line naming it, never a traceback; a key pasted where
its variable's name belongs is refused without being written anywhere."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from workflow_helpers import REPO, SNAKEMAKE, copy_workflow, snakemake

# A YTE expression that leaves a file behind when it runs: the proof that it did not.
EVIL = """\
__use_yte__: true
__definitions__:
  - open("ran.txt", "w").write("YTE ran")
generate:
  max_new_tokens: ?open("ran.txt", "w").write("YTE ran") or 8
"""

YTE_REFUSED = re.compile(r"shared\.yaml, line \d+: __use_yte__: YTE templates run Python")


def evil_config(workdir: Path, body: str = EVIL) -> Path:
    path = workdir / "shared.yaml"
    good = (workdir / "config" / "config.yaml").read_text(encoding="utf-8")
    path.write_text(good.replace("generate:\n", "generate_old:\n") + body, encoding="utf-8")
    return path


def files_of(workdir: Path) -> set[str]:
    return {str(p.relative_to(workdir)) for p in workdir.rglob("*") if "__pycache__" not in str(p)}


def test_plain_snakemake_refuses_a_yte_config_before_it_runs(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    evil_config(workdir)
    before = files_of(workdir)
    proc = snakemake(workdir, "-n", "--configfile", "shared.yaml", check=False, timeout=120)
    assert proc.returncode != 0
    assert YTE_REFUSED.search(proc.stderr), proc.stderr
    assert "a config is data, never code (docs/security.md)" in proc.stderr
    assert not (workdir / "ran.txt").exists()
    assert files_of(workdir) == before  # no .snakemake/, no lock, no log


def test_a_yte_switch_a_merge_key_brings_is_refused_before_it_runs(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    # no __use_yte__ among the file's own top-level keys: the merge adds it once loaded
    evil_config(workdir, EVIL.replace("__use_yte__: true\n", "<<: {__use_yte__: true}\n"))
    before = files_of(workdir)
    proc = snakemake(workdir, "-n", "--configfile", "shared.yaml", check=False, timeout=120)
    assert proc.returncode != 0
    assert re.search(r"shared\.yaml, line \d+: <<\.__use_yte__: YTE templates", proc.stderr)
    assert re.search(r"line \d+: generate\.max_new_tokens: the value '\?open", proc.stderr)
    assert not (workdir / "ran.txt").exists()
    assert files_of(workdir) == before


def test_make_refuses_a_yte_config_before_it_runs(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    shutil.copy2(REPO / "Makefile", workdir / "Makefile")
    shutil.copy2(REPO / "pyproject.toml", workdir / "pyproject.toml")
    evil_config(workdir)
    venv = SNAKEMAKE.parent.parent
    proc = subprocess.run(
        # -o: the venv is the repo's, set up already; never rebuilt from this copy
        ["make", "-o", f"{venv}/.setup-done", "dry-run", "CONFIG=shared.yaml", f"VENV={venv}"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert YTE_REFUSED.search(proc.stderr), proc.stderr
    assert not (workdir / "ran.txt").exists()
    assert not (workdir / ".snakemake").exists()


def test_a_python_tag_is_named_with_its_key_not_as_mixed_indentation(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    evil_config(workdir, "sglang:\n  env:\n    HOOK: !!python/name:os.system\n")
    proc = snakemake(workdir, "-n", "--configfile", "shared.yaml", check=False, timeout=120)
    assert proc.returncode != 0
    assert "sglang.env.HOOK: tag !!python/name:os.system builds a Python object" in proc.stderr
    assert "whitespace and tab" not in proc.stderr
    assert not (workdir / ".snakemake").exists()


def test_an_alias_bomb_in_server_args_is_refused_at_its_key(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    bomb = "".join(f"    b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]\n" for i in range(1, 12))
    evil_config(workdir, "sglang:\n  server_args:\n    b0: &b0 [x, x, x]\n" + bomb)
    # 3 x 9**11 values expanded: a bound far above a refusal's milliseconds, below the expansion
    proc = snakemake(workdir, "-n", "--configfile", "shared.yaml", check=False, timeout=120)
    assert proc.returncode != 0
    assert re.search(r"line \d+: sglang\.server_args\.b\d+\[\d+\]: more than", proc.stderr)
    assert "more than 100,000 values with its aliases expanded" in proc.stderr


def test_without_the_profile_the_snakefile_still_refuses_the_file(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    evil_config(workdir)
    args = ("-n", "--workflow-profile", "none", "--cores", "1", "--configfile", "shared.yaml")
    proc = snakemake(workdir, *args, check=False, timeout=300)
    assert proc.returncode != 0
    assert YTE_REFUSED.search(proc.stderr), proc.stderr
    # Snakemake's own loader ran the template before any workflow code: the trust model
    # docs/security.md states for this route
    assert (workdir / "ran.txt").read_text() == "YTE ran"


def test_an_alias_bomb_given_with_config_is_refused_before_snakemake_merges_it(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    levels = ", ".join(
        f"m{i}: &m{i} {{{', '.join(f'k{j}: *m{i - 1}' for j in range(10))}}}"
        if i
        else "m0: &m0 {x: 1}"
        for i in range(10)
    )
    bomb = f"sglang={{server_args: {{{levels}}}}}"  # 10**9 mappings once merged
    proc = snakemake(workdir, "-n", "--config", bomb, check=False, timeout=120)
    assert proc.returncode != 0
    assert re.search(r"--config, line 1: sglang\.server_args\.m5\.k\d: more than", proc.stderr)
    assert not (workdir / ".snakemake").exists()


def edited_config(workdir: Path, old: str, new: str) -> Path:
    """The workdir's config with `old` (one line of it, once) replaced by `new`, as mine.yaml."""
    good = (workdir / "config" / "config.yaml").read_text(encoding="utf-8")
    assert good.count(old) == 1, old
    path = workdir / "mine.yaml"
    path.write_text(good.replace(old, new), encoding="utf-8")
    return path


def one_line_refusal(proc: subprocess.CompletedProcess, fault: str) -> None:
    """The run failed with exit code 1 on `fault`, printed as one line, and no traceback."""
    assert proc.returncode == 1, proc.stderr
    assert [line for line in proc.stderr.splitlines() if fault in line] == [f"  {fault}"]
    assert "Traceback" not in proc.stderr and "Error in file" not in proc.stderr


def test_a_dataset_named_no_is_one_line_not_a_type_error(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    edited_config(workdir, "\n  tiny:\n", "\n  no:\n")
    proc = snakemake(workdir, "-n", "--configfile", "mine.yaml", check=False, timeout=120)
    one_line_refusal(
        proc,
        "mine.yaml, line 5: datasets.no: a key must be a string, and YAML reads `no` as false "
        "(a boolean); quote it: 'no'",
    )
    assert "TypeError" not in proc.stderr


def test_a_repeated_key_is_one_line_naming_both_lines(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    path = edited_config(workdir, "\n  epochs: 1\n", "\n  epochs: 1\n  epochs: 3\n")
    line = path.read_text(encoding="utf-8").splitlines().index("  epochs: 3") + 1
    proc = snakemake(workdir, "-n", "--configfile", "mine.yaml", check=False, timeout=120)
    one_line_refusal(
        proc,
        f"mine.yaml, line {line}: train.epochs: repeated (first at line {line - 1}); give each "
        "key once in a mapping (YAML keeps the last and drops the first)",
    )


def test_a_missing_config_file_is_one_line_naming_it(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    proc = snakemake(workdir, "-n", "--configfile", "nope.yaml", check=False, timeout=120)
    one_line_refusal(proc, "nope.yaml: no such config file (--configfile)")
    assert "FileNotFoundError" not in proc.stderr


def test_a_key_pasted_as_its_variables_name_is_refused_and_written_nowhere(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    secret = "hf_" + "Zq8" * 12
    edited_config(workdir, "generate:\n", f"sglang:\n  api_key_env: {secret}\ngenerate:\n")
    proc = snakemake(workdir, "-n", "--configfile", "mine.yaml", check=False, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "  sglang.api_key_env: holds what looks like a key itself" in proc.stderr
    assert secret not in proc.stdout + proc.stderr
    written = [p for p in workdir.rglob("*") if p.is_file() and p.name != "mine.yaml"]
    assert [p for p in written if secret.encode() in p.read_bytes()] == []


def test_an_env_name_that_is_shell_code_is_refused_at_parse_time(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    edited_config(workdir, "generate:\n", "sglang:\n  env:\n    'X=1; touch f; Y': v\ngenerate:\n")
    proc = snakemake(workdir, "-n", "--configfile", "mine.yaml", check=False, timeout=120)
    one_line_refusal(
        proc,
        "sglang.env: name 'X=1; touch f; Y' must match '^[A-Za-z_][A-Za-z0-9_]*$' (an "
        "environment variable's name is letters, digits and `_`, not starting with a digit)",
    )
    assert not (workdir / "f").exists()


def test_a_server_flag_that_reopens_what_specbuild_closes_is_refused_at_parse_time(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    args = "sglang:\n  server_args:\n    hos: 0.0.0.0\n    host: 0.0.0.0\ngenerate:\n"
    edited_config(workdir, "generate:\n", args)
    proc = snakemake(workdir, "-n", "--configfile", "mine.yaml", check=False, timeout=120)
    one_line_refusal(
        proc,
        "sglang.server_args.hos: --hos abbreviates --host, which specbuild sets itself (SGLang "
        "takes a unique prefix of a flag and keeps the last value given); set sglang.host",
    )
    one_line_refusal(
        proc,
        "sglang.server_args.host: set sglang.host, not this flag: specbuild sets --host itself",
    )


def test_a_count_that_multiplies_work_past_its_bound_is_one_line_before_any_job(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    edited_config(
        workdir,
        "    shard_size: 4\n",
        "    shard_size: 4\n    answers: 1000000000\n    temperature: 0.7\n",
    )
    proc = snakemake(workdir, "-n", "--configfile", "mine.yaml", check=False, timeout=120)
    one_line_refusal(proc, "datasets.tiny.answers: 1000000000 is greater than the maximum of 64")
