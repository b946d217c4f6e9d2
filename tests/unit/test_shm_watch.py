"""The /dev/shm watch (agent/shm_watch.py) reads maps only when /dev/shm holds a file a look
could record, and stops once it has recorded them; host/shm.files lists /dev/shm at any depth.
This process stands in for a rank: it maps a file of its own in /dev/shm."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from mpilaunch.agent import shm_watch
from mpilaunch.agent.shm_watch import ShmWatch
from mpilaunch.host import shm


class Ranks:
    """What the watch asks of the agent's ranks: these pids, all live."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.live = len(pids)

    def live_pids(self) -> list[int]:
        return self.pids


@pytest.fixture
def segment():  # type: ignore[no-untyped-def]
    """A file in a folder of /dev/shm, made after the watch starts (call it), unlinked after."""
    made: list[Path] = []

    def make(name: str) -> Path:
        folder = Path(shm.SHM_DIR) / f"mpilaunch-unit-{os.getpid()}"
        folder.mkdir(exist_ok=True)
        path = folder / name
        path.write_bytes(b"\0" * 4096)
        made.append(path)
        return path

    yield make
    for path in made:
        path.unlink(missing_ok=True)
        if path.parent.exists() and not any(path.parent.iterdir()):
            path.parent.rmdir()


def test_files_lists_every_depth_and_leaves_out_the_skipped_folder(segment) -> None:  # type: ignore[no-untyped-def]
    path = segment("deep")
    st = os.stat(path)
    found = shm.files()
    assert found is not None and found[str(path)] == (st.st_dev, st.st_ino)
    skipped = shm.files(skip=path.parent.name)
    assert skipped is not None and str(path) not in skipped
    assert shm.files(limit=0) is None  # more entries than the limit: nobody can say what is new


def test_a_look_reads_no_maps_without_a_new_file_and_stops_once_it_has_recorded_them(
    segment, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    read: list[int] = []
    real = shm.mapped_by

    def counted(pid: int) -> dict[str, shm.FileId]:
        read.append(pid)
        return real(pid)

    monkeypatch.setattr(shm, "mapped_by", counted)
    listed = shm.files
    ours = f"{shm.SHM_DIR}/mpilaunch-unit-{os.getpid()}/"  # others' jobs on this machine make files too

    def our_files(skip: str = "", limit: int = 10000) -> dict[str, shm.FileId] | None:
        found = listed(skip, limit)
        return None if found is None else {path: ident for path, ident in found.items() if path.startswith(ours)}

    monkeypatch.setattr(shm, "files", our_files)
    monkeypatch.setattr(shm_watch, "with_descendants", lambda pid: [pid])  # the runner's children are no ranks
    me = os.getpid()
    watch = ShmWatch(Ranks([me, me, me]))  # type: ignore[arg-type]
    watch.look()
    assert read == []  # nothing in /dev/shm that was not there before
    path = segment("mapped")
    with open(path, "r+b") as handle:
        mapping = mmap.mmap(handle.fileno(), 4096)
        try:
            watch.look()
        finally:
            mapping.close()
    assert read == [me]  # the first rank's maps held it: the others' are not read
    assert watch.seen[str(path)] == (os.stat(path).st_dev, os.stat(path).st_ino)
    read.clear()
    watch.look()
    assert read == []  # seen already
    segment("not-mapped")
    watch.look()
    assert read == [me, me, me]  # a new file no rank maps: every rank's maps are read, as before


def test_a_file_deep_in_a_folder_made_before_the_job_is_no_reason_to_read_maps(
    segment, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Another job's PMIx folder (or one a killed job left) holds files below /dev/shm: they
    were there before, so no look reads a rank's maps for them (before: the files there before
    were listed one level deep only, so every look of every job read every rank's maps)."""
    segment("before-the-job")
    read: list[int] = []
    monkeypatch.setattr(shm, "mapped_by", lambda pid: read.append(pid) or {})
    monkeypatch.setattr(shm_watch, "with_descendants", lambda pid: [pid])
    watch = ShmWatch(Ranks([os.getpid()]))  # type: ignore[arg-type]
    for _ in range(3):
        watch.look()
    assert read == []


def test_another_agents_folder_is_never_walked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Hundreds of agents on one machine (the ssh bed, a fork launcher's hosts) each have a
    PMIx folder in /dev/shm that only its own ranks map: a look walks none of them, so an
    agent's looks do not grow with the others' (and their files are no reason to read maps)."""
    read: list[int] = []
    monkeypatch.setattr(shm, "mapped_by", lambda pid: read.append(pid) or {})
    monkeypatch.setattr(shm_watch, "with_descendants", lambda pid: [pid])
    watch = ShmWatch(Ranks([os.getpid()]))  # type: ignore[arg-type]
    folder = Path(shm.SHM_DIR) / f"{shm.SERVER_FOLDER.format(pid=1)}unit-{os.getpid()}"
    folder.mkdir()
    try:
        (folder / "dstore").write_bytes(b"\0" * 4096)  # made after the watch began: new, yet not ours
        watch.look()
        listed = shm.files(skip=shm.AGENTS_FOLDERS)
        assert listed is not None and not [path for path in listed if path.startswith(str(folder))]
    finally:
        (folder / "dstore").unlink()
        folder.rmdir()
    assert read == []
