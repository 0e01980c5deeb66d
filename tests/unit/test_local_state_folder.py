"""The local service's state folder, where its credentials are kept, is its user's alone: made 0700 as it is created,
an older one of this user's (0755) made so, one another user owns or may write in refused with the fix."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slsml.local.private import private_folder
from slsml.local.service import user_state_dir
from slsml.spec.errors import SlsmlError

NOBODY = 65534


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_folder_is_created_private(tmp_path: Path) -> None:
    folder = tmp_path / "project" / ".slsml" / "local"
    private_folder(folder)
    assert _mode(folder) == 0o700


def test_an_older_folder_of_this_user_is_made_private(tmp_path: Path) -> None:
    folder = tmp_path / "local"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    private_folder(folder)
    assert _mode(folder) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_folder_others_may_write_in_is_refused(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "local"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(SlsmlError, match=r"other users may write in .*remove it and run `slsml local up` again"):
        private_folder(folder)
    assert _mode(folder) == mode  # left as it was


def test_a_folder_another_user_owns_or_a_file_in_its_place_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    placed = tmp_path / "placed"
    placed.symlink_to(theirs)
    for folder in (theirs, placed):
        with pytest.raises(SlsmlError, match="is not a folder of yours"):
            private_folder(folder)


def test_the_state_folder_is_the_users_wherever_a_command_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for unset in ("", "relative/state"):  # unset, or not absolute (XDG): ignored
        monkeypatch.setenv("XDG_STATE_HOME", unset)
        assert user_state_dir() == tmp_path / "home" / ".local" / "state" / "slsml" / "local"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert user_state_dir() == tmp_path / "xdg" / "slsml" / "local"
