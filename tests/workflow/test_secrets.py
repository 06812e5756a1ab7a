"""No secret reaches the console, .snakemake/, logs/, results/ or the report: a credential in
the config is refused at parse time naming its key (never its value), and the keys a run
really needs live in the environment, named by config (`make serve`'s on a host beyond
loopback: sglang.serve_api_key_env). Real snakemake processes, then every file they wrote is
searched for the secrets."""

from __future__ import annotations

from pathlib import Path

from workflow_helpers import make_workdir, snakemake, tiny_config, write_config

from specbuild.infra.io import read_json

HF = "hf_" + "Qz7" * 12
SERVE_KEY = "sk-serve-" + "Wq4" * 10


def written_files(workdir: Path) -> list[Path]:
    """Every file a run could have written a secret into (the target's weights are links to
    the cached model: not written by the run)."""
    roots = [workdir / name for name in (".snakemake", "logs", "results")]
    return [
        p
        for root in roots
        if root.exists()
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and p.suffix != ".safetensors"
    ]


def leaks(workdir: Path, console: str, secrets: list[str]) -> list[str]:
    found = [f"console: {s[:6]}..." for s in secrets if s in console]
    for path in written_files(workdir):
        data = path.read_bytes()
        found += [f"{path.relative_to(workdir)}: {s[:6]}..." for s in secrets if s.encode() in data]
    return found


def test_a_token_in_the_config_is_refused_naming_the_key_and_is_written_nowhere(
    tmp_path, target_dir
):
    wd = make_workdir(tmp_path / "wf", target_dir)
    config = tiny_config()
    config["sglang"] = {"env": {"HF_TOKEN": HF}, "server_args": {"api_key": SERVE_KEY}}
    write_config(wd, config)
    proc = snakemake(wd, "-n", check=False, timeout=300)
    assert proc.returncode != 0
    assert "sglang.env.HF_TOKEN: the name says it is a credential" in proc.stderr
    assert "sglang.server_args.api_key: the name says it is a credential" in proc.stderr
    assert "sglang.api_key_env" in proc.stderr
    assert leaks(wd, proc.stdout + proc.stderr, [HF, SERVE_KEY]) == []


def test_keys_from_the_environment_reach_no_file_of_a_real_run(
    tmp_path, target_dir, random_drafter, monkeypatch
):
    wd = make_workdir(tmp_path / "wf", target_dir)
    theirs = random_drafter(tmp_path / "theirs", read_json(target_dir / "config.json"), [1, 14, 26])
    config = tiny_config()
    config["bench"] = {"engines": ["hf"], "chains": ["3-1-4"], "variants": []}
    config["bench"]["drafters"] = {"theirs": str(theirs)}
    config["sglang"] = {"host": "0.0.0.0", "serve_api_key_env": "SERVE_KEY"}
    config["sglang"]["env"] = {"NCCL_DEBUG": "INFO"}
    config["report"] = {"train_metrics": None}
    write_config(wd, config)
    monkeypatch.setenv("HF_TOKEN", HF)
    monkeypatch.setenv("SERVE_KEY", SERVE_KEY)
    run = snakemake(wd, "results/serve.sh", timeout=600)
    report = snakemake(wd, "results/serve.sh", "--report", "results/report.html", timeout=600)
    script = (wd / "results" / "serve.sh").read_text()
    assert "--host 0.0.0.0" in script and '--config "$keydir/key.yaml"' in script
    assert "${SERVE_KEY//" in script  # the key read from the environment when it runs
    assert "# WARNING: sglang.host '0.0.0.0' is not loopback" in script
    assert "answers other machines" in (wd / "logs" / "serve.log").read_text()
    assert (wd / "results" / "report.html").stat().st_size > 0
    assert any((wd / ".snakemake" / "metadata").iterdir())  # what is searched is there
    console = run.stdout + run.stderr + report.stdout + report.stderr
    assert leaks(wd, console, [HF, SERVE_KEY]) == []


def test_a_secret_under_a_name_that_says_nothing_is_refused_by_its_shape(tmp_path, target_dir):
    db_url = "postgres://user:" + "pw9" * 4 + "@db.internal/app"
    nvapi = "nvapi-" + "Rt5" * 20
    wd = make_workdir(tmp_path / "wf", target_dir)
    config = tiny_config()
    config["sglang"] = {"env": {"DATABASE_URL": db_url, "NGC_AUTH": nvapi, "NCCL_DEBUG": "INFO"}}
    write_config(wd, config)
    proc = snakemake(wd, "-n", check=False, timeout=300)
    assert proc.returncode != 0
    for key in ("sglang.env.DATABASE_URL", "sglang.env.NGC_AUTH"):
        assert f"  {key}: the value looks like a credential (" in proc.stderr
    assert "Export it in the environment instead" in proc.stderr
    assert leaks(wd, proc.stdout + proc.stderr, [db_url, nvapi]) == []
