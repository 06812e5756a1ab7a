"""`make serve`: the chain the sglang engine's bench found fastest, and a script that really runs
the SGLang command with the bench servers' flags and environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specbuild.engines.server import ServerOptions, interpreter
from specbuild.infra.io import write_jsonl
from specbuild.serve import (
    DEFAULT_CHAIN,
    ExposedServerError,
    pick_chain,
    serve_command,
    write_serve_script,
)


def _rows(path, chain, tokens, wall):
    """Rows of one bench job: two single-stream requests and a sweep request that must not
    count (tokens/s = Σ tokens / Σ wall of the bench phase)."""
    row = {"chain": chain, "completion_tokens": tokens, "verify_steps": None, "wall_s": wall}
    row |= {"accepted_per_position": [], "ttft_s": None, "itl_s": None, "phase": "bench"}
    write_jsonl(path, [row, row, {**row, "phase": "sweep", "completion_tokens": 10**6}])
    return path


def test_the_fastest_measured_chain_is_served_and_the_script_says_why(tmp_path):
    rows = [
        _rows(tmp_path / "a.jsonl", "3-1-4", 3116, 10.0),
        _rows(tmp_path / "b.jsonl", "7-1-8", 4295, 10.0),
        _rows(tmp_path / "c.jsonl", "baseline", 7161, 10.0),  # no drafter: never "served" here
    ]
    chain, why = pick_chain(["3-1-4", "7-1-8"], rows)
    assert chain == "7-1-8" and "429.5 tok/s" in why and "3-1-4 311.6" in why


def test_without_measurements_the_first_chain_or_eagle3s_usual_one_is_served():
    assert pick_chain(["5-1-6", "3-1-4"], [])[0] == "5-1-6"
    assert pick_chain([], []) == (DEFAULT_CHAIN, "EAGLE-3's usual chain (no chains configured)")


def test_the_script_runs_the_launcher_with_the_drafter_flags_and_the_environment(tmp_path):
    # a launcher that prints what it was given stands in for sglang.launch_server
    echo = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['NCCL_X']]))"
    command = serve_command(
        fingerprint="results/target/t/fingerprint.json",
        drafter_config="results/drafter/config.json",
        chain="3-1-4",
        server=ServerOptions(
            launcher=("python", "-c", echo),
            server_args={"attention_backend": "triton", "disable_cuda_graph": True},
            draft_attention_backend="triton",
        ),
        port=30001,
    )
    script = tmp_path / "serve.sh"
    write_serve_script(script, command=command, env={"NCCL_X": "a b"}, why="test")
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True)
    argv, env = json.loads(out.stdout)
    # specbuild's own flags last: the value SGLang's argparse keeps is the last one given
    assert argv[-6:] == [
        "--model-path",
        "results/target/t",
        "--host",
        "127.0.0.1",
        "--port",
        "30001",
    ]
    flags = " ".join(argv[:-6])
    assert "--speculative-algorithm EAGLE3" in flags
    assert "--speculative-draft-model-path results/drafter" in flags
    assert "--speculative-num-steps 3 --speculative-eagle-topk 1" in flags
    assert "--speculative-num-draft-tokens 4" in flags and "--disable-cuda-graph" in flags
    assert "--speculative-draft-attention-backend triton" in flags
    # this interpreter, under the one name make and python -m both give it
    assert env == "a b" and command[0] == interpreter()
    assert os.path.samefile(command[0], sys.executable)


def _exposed_command(host: str) -> list[str]:
    echo = "import json, sys; print(json.dumps(sys.argv[1:]))"
    return serve_command(
        fingerprint="results/target/t/fingerprint.json",
        drafter_config="results/drafter/config.json",
        chain="3-1-4",
        server=ServerOptions(launcher=("python", "-c", echo), host=host),
        port=30001,
    )


def test_a_server_for_other_machines_without_an_api_key_is_refused_and_nothing_written(
    tmp_path,
):
    script = tmp_path / "serve.sh"
    with pytest.raises(ExposedServerError) as err:
        write_serve_script(
            script, command=_exposed_command("0.0.0.0"), env={}, why="t", host="0.0.0.0"
        )
    assert str(err.value.code).startswith("sglang.host '0.0.0.0' is not loopback")
    assert "sglang.serve_api_key_env" in str(err.value.code)
    assert list(tmp_path.iterdir()) == []


def test_a_server_for_other_machines_requires_the_key_from_the_environment(tmp_path, caplog):
    script = tmp_path / "serve.sh"
    key = "sk-'k\"" + "k" * 40  # quotes survive the trip through the file
    command = _exposed_command("0.0.0.0")
    with caplog.at_level("WARNING", logger="specbuild"):
        write_serve_script(
            script, command=command, env={}, why="t", host="0.0.0.0", api_key_env="SERVE_KEY"
        )
    assert "answers other machines" in caplog.text
    text = script.read_text()
    assert "# WARNING: sglang.host '0.0.0.0' is not loopback" in text and key not in text
    env = {k: v for k, v in os.environ.items() if k != "SERVE_KEY"}
    unset = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert unset.returncode != 0 and "export SERVE_KEY: the API key clients" in unset.stderr
    given = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env={**env, "SERVE_KEY": key}
    )
    argv = json.loads(given.stdout)
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert key not in given.stdout  # in no command line (ps), only in an owner-only file
    assert argv[-2] == "--config"
    key_file = Path(argv[-1])
    assert yaml.safe_load(key_file.read_text()) == {"api-key": key}
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert key_file.parent.stat().st_mode & 0o777 == 0o700


def test_a_loopback_server_needs_no_key_and_gets_no_warning(tmp_path, caplog):
    script = tmp_path / "serve.sh"
    with caplog.at_level("WARNING", logger="specbuild"):
        write_serve_script(script, command=_exposed_command("127.0.0.1"), env={}, why="t")
    assert "WARNING" not in script.read_text() and caplog.text == ""
    assert "--api-key" not in script.read_text() and "--config" not in script.read_text()


def test_no_config_text_runs_as_a_command_in_the_script(tmp_path):
    """Names, values and the text of comments all come from config: none may reach bash as
    code. A name that is no variable name is refused and nothing is written; values are
    exported as they are; a line break in a comment's text stays in the comment."""
    echo = "import json, os; print(json.dumps([os.environ['A'], os.environ['B']]))"
    command = _exposed_command("127.0.0.1")
    command[command.index("-c") + 1] = echo
    script = tmp_path / "serve.sh"
    with pytest.raises(ValueError, match="environment variable name 'X=1; touch f; Y'"):
        write_serve_script(script, command=command, env={"X=1; touch f; Y": "v"}, why="t")
    assert list(tmp_path.iterdir()) == []
    hostile = {"A": "$(touch f)", "B": "'; touch f; '"}
    write_serve_script(script, command=command, env=hostile, why="t\ntouch f")
    out = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [hostile["A"], hostile["B"]]
    assert not (tmp_path / "f").exists()
    assert "# chain: t touch f" in script.read_text()
    with pytest.raises(ValueError, match="is no environment variable name"):
        write_serve_script(script, command=command, env={}, why="t", api_key_env="K; touch f")
