"""Folders only this user may write (specbuild.infra.private_dirs): created 0700 whatever the
umask, and an existing one refused, naming it and the fix, when it is a link, not a folder,
another user's, or writable by its group or others."""

from __future__ import annotations

import os

import pytest

from specbuild.infra.private_dirs import UnsafeFolderError, check_private_dir, private_dir


def test_a_folder_is_created_0700_under_a_group_writable_umask(tmp_path):
    old = os.umask(0o002)
    try:
        made = private_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert made.stat().st_mode & 0o777 == 0o700
    assert private_dir(made) == made  # an existing one of ours is used as it is


def test_a_folder_someone_else_could_write_is_refused_naming_it_and_the_fix(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    with pytest.raises(UnsafeFolderError) as err:
        private_dir(shared)
    assert str(err.value).startswith(
        f"{shared}: is writable by its group or others (mode 0775); specbuild acts as you"
    )
    assert f"rm -r {shared}" in str(err.value) and "SPECBUILD_KEEPERS" in str(err.value)
    (tmp_path / "mine").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    with pytest.raises(UnsafeFolderError, match="is a symbolic link"):
        check_private_dir(tmp_path / "link")
    (tmp_path / "file").write_text("")
    with pytest.raises(UnsafeFolderError, match="is not a folder"):
        private_dir(tmp_path / "file", setting="SPECBUILD_GPU_LOCK_DIR")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_another_users_folder_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UnsafeFolderError, match="belongs to uid 65534, not to you"):
        private_dir(theirs)
