"""specbuild.seed's refusals: nothing to pack, a seed with no generated shard, and a member
that would land outside the workdir (the round trip through a real build:
tests/workflow/test_seed_workflow.py)."""

from __future__ import annotations

import io
import tarfile

import pytest

from specbuild.seed import generated_shards, pack, plant


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
