"""Every snippet of docs/troubleshooting.md runs: its YAML is a config the workflow accepts (the
files it names made first), its shell commands succeed in a workflow folder."""

from __future__ import annotations

import codecs
import copy
import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file
from workflow_helpers import REPO, make_workdir, planned_jobs, tiny_config, write_config

from specbuild.eagle.drafter_tensors import tensor_names

pytestmark = pytest.mark.workflow

DOC = REPO / "docs" / "troubleshooting.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)


def _blocks(lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(DOC.read_text()) if kind == lang]


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _make_what_it_names(wd: Path, snippet: dict, target_config: dict) -> None:
    """The dataset files and drafter folders a snippet points at, shaped for the target."""
    for spec in snippet.get("datasets", {}).values():
        path = wd / spec["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        row = {"messages": [{"role": "user", "content": "Hi"}]}
        path.write_bytes(gzip.compress(codecs.BOM_UTF8 + (json.dumps(row) + "\r\n").encode()))
    for folder in snippet.get("bench", {}).get("drafters", {}).values():
        path = wd / folder
        path.mkdir(parents=True)
        layers = target_config["num_hidden_layers"]
        config = {
            "hidden_size": target_config["hidden_size"],
            "vocab_size": target_config["vocab_size"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, layers // 2 - 1, layers - 4]},
        }
        (path / "config.json").write_text(json.dumps(config))
        # a sound header with every tensor's name (one element each: a config.json without
        # every size decides no shape): checked at parse
        tensors = {name: np.zeros(1, np.float32) for name in tensor_names()}
        save_file(tensors, str(path / "model.safetensors"))


def test_the_docs_have_snippets_of_each_kind():
    assert len(_blocks("yaml")) == 2 and len(_blocks("sh")) == 4


@pytest.mark.parametrize("index", range(2))
def test_each_yaml_snippet_is_a_config_the_workflow_plans(tmp_path, target_dir, index):
    snippet = yaml.safe_load(_blocks("yaml")[index])
    wd = make_workdir(tmp_path / "wf", target_dir)
    target_config = json.loads((target_dir / "config.json").read_text())
    _make_what_it_names(wd, snippet, target_config)
    write_config(wd, _merge(tiny_config(), snippet))
    rules = {rule for rule, _ in planned_jobs(wd)}
    assert "samples" in rules  # parsed, checked and planned


def test_each_shell_snippet_succeeds_in_a_workflow_folder(tmp_path, target_dir):
    wd = make_workdir(tmp_path / "wf", target_dir)
    env = {
        **os.environ,
        "BIG": str(tmp_path / "big-disk"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    for snippet in _blocks("sh"):
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", snippet],
            cwd=wd,
            env=env,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, f"{snippet}\n{proc.stdout}\n{proc.stderr}"
    assert (wd / "results").is_symlink()
    assert (tmp_path / "big-disk" / "specbuild-results" / "target").is_dir()  # moved, not lost
    assert planned_jobs(wd)  # the workflow runs on the moved results/
