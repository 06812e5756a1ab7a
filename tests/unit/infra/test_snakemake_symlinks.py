import errno
import os

import pytest
import snakemake.api  # noqa: F401  (snakemake.dag imported first is a circular import)
from snakemake.dag import DAG

from specbuild.infra.snakemake_symlinks import keep_linked_output_folders


def _failing_cleanup(path: str):
    def cleanup(self) -> None:
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)

    return cleanup


def test_the_cleanup_stops_quietly_at_a_linked_folder_only(tmp_path, monkeypatch):
    (tmp_path / "disk").mkdir()
    (tmp_path / "results").symlink_to(tmp_path / "disk")
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(DAG, "cleanup_workdir", _failing_cleanup(str(tmp_path / "results")))
    assert keep_linked_output_folders() and keep_linked_output_folders()  # idempotent
    DAG.cleanup_workdir(None)  # the symlinked folder: nothing raised
    assert os.path.islink(tmp_path / "results")
    monkeypatch.setattr(DAG, "cleanup_workdir", _failing_cleanup(str(tmp_path / "file")))
    keep_linked_output_folders()
    with pytest.raises(NotADirectoryError):  # anything else still fails the run
        DAG.cleanup_workdir(None)


def test_a_snakemake_without_the_cleanup_is_told(monkeypatch, caplog):
    monkeypatch.delattr(DAG, "cleanup_workdir")
    assert keep_linked_output_folders() is False
    assert "no DAG.cleanup_workdir" in caplog.text
