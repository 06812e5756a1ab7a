"""specbuild.seed's refusals (nothing to pack, a seed with no generated shard, a member that
would land outside the workdir), planting a subset of a seed's datasets, and a failed plant
undone (the round trip through a real build: tests/workflow/test_seed_workflow.py)."""

from __future__ import annotations

import io
import subprocess
import tarfile

import pytest

from specbuild.seed import generated_shards, main, pack, plant


def _tar(path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_pack_needs_generated_shards_and_lists_only_shards(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results/generated"):
        pack(tmp_path / "seed.tar.gz", tmp_path)
    shard = tmp_path / "results/generated/chat/00000.jsonl"
    shard.parent.mkdir(parents=True)
    shard.write_text("{}\n")
    shard.with_suffix(".counts.json").write_text("{}")
    (tmp_path / "results/generated/chat/00000.rejected.jsonl").write_text("")
    (tmp_path / "results/samples/chat").mkdir(parents=True)
    assert pack(tmp_path / "out/seed.tar.gz", tmp_path) == ["results/generated/chat/00000.jsonl"]
    with tarfile.open(tmp_path / "out/seed.tar.gz") as tar:
        assert "results/generated/chat/00000.counts.json" in tar.getnames()
        assert "results/samples/chat" in tar.getnames()


def test_plant_refuses_a_seed_without_shards_or_with_a_path_out_of_the_workdir(tmp_path):
    empty = tmp_path / "empty.tar.gz"
    _tar(empty, {"results/samples/chat/00000.jsonl": b"{}\n"})
    with pytest.raises(ValueError, match="no results/generated/<dataset>/<shard>.jsonl"):
        plant(empty, ["true"], tmp_path)
    evil = tmp_path / "evil.tar.gz"
    _tar(evil, {"results/generated/chat/00000.jsonl": b"{}\n", "../outside.txt": b"x"})
    assert generated_shards(evil) == ["results/generated/chat/00000.jsonl"]
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(tarfile.OutsideDestinationError):
        plant(evil, ["touch", "ran"], work)  # stands in for snakemake: the target step
    assert not (tmp_path / "outside.txt").exists()
    assert list(work.iterdir()) == []  # refused before the target step or any file


SEED = {
    f"results/{top}/{dataset}/00000.{ext}": b"{}\n"
    for dataset in ("chat", "chat_mt")
    for top, ext in (("samples", "jsonl"), ("checks/samples", "json"), ("generated", "jsonl"))
}
# stands in for snakemake: logs its arguments; fails the touch when FAIL is set
FAKE = ["sh", "-c", 'echo "$*" >>calls; [ -z "$FAIL" ] || case "$*" in *--touch*) exit 3;; esac']


def test_plant_only_the_datasets_named(tmp_path, monkeypatch):
    _tar(tmp_path / "seed.tar.gz", SEED)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.delenv("FAIL", raising=False)
    with pytest.raises(ValueError, match=r"for dataset\(s\) \['gsm8k'\]"):
        plant(tmp_path / "seed.tar.gz", [*FAKE, "sh"], work, datasets=["gsm8k"])
    assert plant(tmp_path / "seed.tar.gz", [*FAKE, "sh"], work, datasets=["chat"]) == [
        "results/generated/chat/00000.jsonl"
    ]
    assert (work / "calls").read_text().splitlines() == [
        "--until target",
        "--touch results/generated/chat/00000.jsonl",
    ]
    planted = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file())
    assert planted == sorted(["calls", *(n for n in SEED if "/chat/" in n)])


def test_a_failed_plant_takes_its_files_back_and_can_be_run_again(tmp_path, monkeypatch):
    _tar(tmp_path / "seed.tar.gz", SEED)
    work = tmp_path / "work"
    (work / "results/samples/chat").mkdir(parents=True)
    kept = work / "results/samples/chat/notes.txt"  # not the seed's: left alone
    kept.write_text("mine")
    monkeypatch.setenv("FAIL", "1")
    with pytest.raises(subprocess.CalledProcessError):
        plant(tmp_path / "seed.tar.gz", [*FAKE, "sh"], work)
    assert sorted(p for p in work.rglob("*") if p.is_file()) == sorted([kept, work / "calls"])
    monkeypatch.delenv("FAIL")
    assert len(plant(tmp_path / "seed.tar.gz", [*FAKE, "sh"], work)) == 2
    assert all((work / name).read_bytes() == data for name, data in SEED.items())


def test_the_command_line_takes_the_build_whole_after_the_separator(tmp_path, monkeypatch):
    _tar(tmp_path / "seed.tar.gz", SEED)
    monkeypatch.delenv("FAIL", raising=False)
    monkeypatch.chdir(tmp_path)
    main(["plant", "seed.tar.gz", "--datasets", "chat_mt", "--", *FAKE, "sh", "--cores", "4"])
    assert (tmp_path / "calls").read_text().splitlines() == [
        "--cores 4 --until target",
        "--cores 4 --touch results/generated/chat_mt/00000.jsonl",
    ]
    with pytest.raises(SystemExit, match="--datasets names no dataset"):  # never "all of them"
        main(["plant", "seed.tar.gz", "--datasets", "", "--", *FAKE, "sh"])
