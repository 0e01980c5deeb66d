"""What the local cloud and its runs keep on disk is their user's alone: folders 0700, files 0600 (a local service
is reachable by its own user only, and so are its credentials, logs and models)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from slsml.spec.errors import SlsmlError


def private_folder(folder: Path, command: str = "slsml local up") -> None:
    """Make ``folder`` 0700 as it is created (its parents as they are). One there already is made so if it is this
    user's and no other could write in it (a folder of an older slsml: 0755); SlsmlError naming the fix (remove it,
    run ``command`` again) if another user owns it or could have placed files in it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=0o700)
        return
    except FileExistsError:
        pass
    found = folder.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise SlsmlError(f"{folder} is not a folder of yours: remove it, or run `{command}` elsewhere")
    if found.st_mode & 0o022:
        raise SlsmlError(
            f"other users may write in {folder} (mode {stat.S_IMODE(found.st_mode):o}): remove it and run"
            f" `{command}` again"
        )
    if found.st_mode & 0o077:
        os.chmod(folder, 0o700)  # before anything private is written in it


def write_private(path: Path, data: bytes) -> None:
    """``data`` in ``path``, 0600 (its user's alone), however the file was before."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as written:
        os.fchmod(written.fileno(), 0o600)
        written.write(data)
