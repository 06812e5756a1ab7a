"""`make serve`: the chain the sglang engine's bench found fastest, and a script that really runs
the SGLang command with the bench servers' flags and environment."""

from __future__ import annotations

import json
import subprocess
import sys

from specbuild.backends.server import ServerOptions
from specbuild.io import write_jsonl
from specbuild.serve import DEFAULT_CHAIN, pick_chain, serve_command, write_serve_script


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
    assert argv[:6] == [
        "--model-path",
        "results/target/t",
        "--host",
        "127.0.0.1",
        "--port",
        "30001",
    ]
    flags = " ".join(argv[6:])
    assert "--speculative-algorithm EAGLE3" in flags
    assert "--speculative-draft-model-path results/drafter" in flags
    assert "--speculative-num-steps 3 --speculative-eagle-topk 1" in flags
    assert "--speculative-num-draft-tokens 4" in flags and "--disable-cuda-graph" in flags
    assert "--speculative-draft-attention-backend triton" in flags
    assert env == "a b" and command[0] == sys.executable
