"""Refusals at parse time through the real `snakemake`: a target name that would leave
results/target/, and a drafter built elsewhere whose weights are truncated or claim 2^62
bytes. Each names the key (and the file), prints no traceback, and leaves every file as it
was: the target stage never ran, so `results/report.html` and a linked folder stay."""

from __future__ import annotations

from pathlib import Path

from workflow_helpers import make_workdir, snakemake, tiny_config, write_config

from specbuild.infra.io import read_json


def tree(workdir: Path) -> dict[str, bytes]:
    """Every file under results/ by path, links not followed (the target's are the cache's)."""
    root = workdir / "results"
    return {
        str(p.relative_to(workdir)): (p.read_bytes() if not p.is_symlink() else b"link")
        for p in sorted(root.rglob("*"))
        if (p.is_file() or p.is_symlink()) and "target" not in p.parts
    }


def test_a_target_name_of_dots_is_refused_and_results_keeps_every_file(tmp_path, target_dir):
    wd = make_workdir(tmp_path / "wf", target_dir)
    (wd / "results" / "report.html").write_text("<html>earlier report</html>")
    (wd / "results" / "serve.sh").write_text("#!/bin/sh\n")
    big = tmp_path / "big"
    big.mkdir()
    (wd / "results" / "hidden").symlink_to(big, target_is_directory=True)
    config = tiny_config()
    config["target"]["name"] = ".."
    write_config(wd, config)
    before = tree(wd)
    proc = snakemake(wd, "--cores", "1", "results/target/../fingerprint.json", check=False)
    assert proc.returncode != 0
    assert "target.name: '..' must match" in proc.stderr
    assert "(dots alone name the folder itself or one above it" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert tree(wd) == before and (wd / "results" / "hidden").is_symlink()


def test_a_truncated_drafter_built_elsewhere_is_named_with_its_key_and_file_at_parse_time(
    tmp_path, target_dir, random_drafter
):
    wd = make_workdir(tmp_path / "wf", target_dir)
    theirs = random_drafter(wd / "theirs", read_json(target_dir / "config.json"), [1, 14, 26])
    weights = theirs / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    huge = random_drafter(wd / "huge", read_json(target_dir / "config.json"), [1, 14, 26])
    (huge / "model.safetensors").write_bytes((2**62).to_bytes(8, "little") + b"{}")
    config = tiny_config()
    config["bench"] = {"engines": ["hf"], "chains": ["3-1-4"], "variants": []}
    config["bench"]["drafters"] = {"theirs": "theirs", "huge": "huge"}
    config["report"] = {"train_metrics": None}
    write_config(wd, config)
    proc = snakemake(wd, "-n", check=False)
    assert proc.returncode != 0
    assert "bench.drafters.theirs: theirs/model.safetensors: its tensors declare" in proc.stderr
    assert "truncated (a copy that did not finish?)" in proc.stderr
    assert f"bench.drafters.huge: huge/model.safetensors: its header claims {2**62:,}" in (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert not (wd / "results" / "bench").exists()


def test_a_drafter_built_elsewhere_with_a_renamed_tensor_is_named_at_parse_time(
    tmp_path, target_dir, random_drafter
):
    from safetensors.torch import load_file, save_file

    wd = make_workdir(tmp_path / "wf", target_dir)
    theirs = random_drafter(wd / "theirs", read_json(target_dir / "config.json"), [1, 14, 26])
    weights = theirs / "model.safetensors"
    tensors = load_file(weights)
    tensors["fcx.weight"] = tensors.pop("fc.weight")
    save_file(tensors, str(weights))
    config = tiny_config()
    config["bench"] = {"engines": ["hf"], "chains": ["3-1-4"], "variants": []}
    config["bench"]["drafters"] = {"theirs": "theirs"}
    config["report"] = {"train_metrics": None}
    write_config(wd, config)
    proc = snakemake(wd, "-n", check=False)
    assert proc.returncode == 1, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "bench.drafters.theirs" in line]
    assert line.startswith(
        "  bench.drafters.theirs: theirs/model.safetensors: no tensor 'fc.weight', which its "
        "config.json implies; unexpected tensor 'fcx.weight'"
    )
    assert "Traceback" not in proc.stderr
    assert not (wd / "results" / "bench").exists()
