"""The PMIx server's folder (host/shm.py): made for this user only, removed whole, links not
followed out of it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mpilaunch.host.shm import make_folder, remove_folder, server_base


def test_a_folder_is_made_private_and_removed_whole_without_following_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the server's")
    folder = make_folder("mpilaunch-unit-")
    try:
        assert os.path.dirname(folder) == server_base()
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        other = make_folder("mpilaunch-unit-")
        assert other != folder
        remove_folder(other)
        (Path(folder) / "a" / "b").mkdir(parents=True)
        (Path(folder) / "a" / "b" / "segment").write_bytes(b"\0" * 64)
        os.symlink(outside, Path(folder) / "to-outside")
        os.symlink(outside / "keep", Path(folder) / "a" / "to-file")
    finally:
        remove_folder(folder)
    assert not os.path.exists(folder)
    assert (outside / "keep").read_text() == "not the server's"
    remove_folder(folder)  # gone already: nothing to say
