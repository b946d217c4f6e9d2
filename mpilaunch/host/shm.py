"""Shared-memory files in /dev/shm: which ones a process maps, and removing those a job left.

MPI libraries put their intra-node segments in /dev/shm (MPICH's `mpich_shm_*`, Open MPI's
`vader_segment.*`, Intel MPI's `shm-*`) and unlink them when every rank has attached, or at
finalize; a rank that aborts, crashes or is killed first leaves its segment behind, under
hydra and mpirun alike. Only files this module is shown (mapped by a rank while it ran) and
that were not there before the job are ever candidates; one is removed only when it is still
the same file, belongs to this user, and no live process maps it.
"""

from __future__ import annotations

import os
import stat

SHM_DIR = "/dev/shm"
_PREFIX = SHM_DIR + "/"
_PREFIX_BYTES = _PREFIX.encode()
_DELETED = " (deleted)"

FileId = tuple[int, int]  # (st_dev, st_ino)


def present() -> set[FileId]:
    """The files in /dev/shm now, at any depth as files() finds them outside the agents' own
    folders (before a job: never to be removed, and never a reason to read the ranks' maps);
    when files() cannot say (too many, or a folder it cannot list), its own entries."""
    listed = files(skip=AGENTS_FOLDERS)
    if listed is not None:
        return set(listed.values())
    try:
        dev = os.stat(SHM_DIR).st_dev
        with os.scandir(SHM_DIR) as entries:
            return {(dev, entry.inode()) for entry in entries}
    except OSError:
        return set()


def files(skip: str = "", limit: int = 10000) -> dict[str, FileId] | None:
    """Every file below /dev/shm, at any depth, by path: its (st_dev, st_ino); folders whose
    name starts with skip are not entered, nor folders this user may not enter (nor may its
    ranks). None when there are more than limit entries to look through, or a folder this user
    may enter cannot be listed: then nobody can say what is new there."""
    found: dict[str, FileId] = {}
    try:
        folders = [(SHM_DIR, os.stat(SHM_DIR).st_dev)]
    except OSError:
        return found  # no /dev/shm: nothing a rank maps can be in it
    entries = 0
    while folders:
        folder, dev = folders.pop()
        try:
            with os.scandir(folder) as listing:
                for entry in listing:
                    entries += 1
                    if entries > limit:
                        return None
                    if entry.is_dir(follow_symlinks=False):
                        if not (skip and folder == SHM_DIR and entry.name.startswith(skip)):
                            folders.append((entry.path, entry.stat(follow_symlinks=False).st_dev))
                    elif entry.is_file(follow_symlinks=False):
                        found[entry.path] = (dev, entry.inode())
        except OSError:
            if folder == SHM_DIR or os.access(folder, os.X_OK):
                return None  # a rank of this user may reach files there that cannot be listed
    return found


def _file_id(line: bytes) -> tuple[str, FileId] | None:
    """(path, (dev, ino)) of a /proc/PID/maps line that maps a file in /dev/shm, else None."""
    fields = line.split(None, 5)
    if len(fields) < 6 or not fields[5].startswith(_PREFIX_BYTES):
        return None
    path = fields[5].rstrip(b"\n").decode("utf-8", "surrogateescape")
    if path.endswith(_DELETED):  # already unlinked: nothing to remove
        return None
    try:
        major, minor = (int(part, 16) for part in fields[3].split(b":"))
        return path, (os.makedev(major, minor), int(fields[4]))
    except ValueError:
        return None


def _maps(pid: int | str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/maps", "rb") as handle:
            return handle.read()
    except OSError:
        return None


def mapped_by(pid: int) -> dict[str, FileId]:
    """The /dev/shm files a live process maps, by path ({} once it is gone)."""
    return dict(_shm_files(_maps(pid)))


def _shm_files(maps: bytes | None) -> list[tuple[str, FileId]]:
    """(path, (dev, ino)) of each /dev/shm file a maps text names (an MPI rank's maps run to
    hundreds of lines, its libraries': only the few that name /dev/shm are parsed)."""
    if not maps or _PREFIX_BYTES not in maps:
        return []
    found = (_file_id(line) for line in maps.splitlines() if _PREFIX_BYTES in line)
    return [entry for entry in found if entry is not None]


def _mapped_anywhere(ids: set[FileId]) -> tuple[set[FileId], bool]:
    """Which of ids some live process maps, and whether every process's maps could be read."""
    mapped: set[FileId] = set()
    complete = True
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        maps = _maps(name)
        if maps is None:
            complete = complete and not os.path.exists(f"/proc/{name}")  # gone is fine; unreadable is not
            continue
        mapped.update(ident for _, ident in _shm_files(maps) if ident in ids)
    return mapped, complete


def remove_left(seen: dict[str, FileId], before: set[FileId]) -> list[str]:
    """Remove the files of `seen` (mapped by the job's ranks) that were not `before` the job,
    are still those files, are this user's, and that no live process maps; the paths removed.
    A file others may map (group or other can read or write it) is kept when some process's
    maps could not be read."""
    candidates: dict[str, os.stat_result] = {}
    uid = os.getuid()
    for path, ident in seen.items():
        if ident in before:
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue  # its MPI removed it
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == ident and st.st_uid == uid:
            candidates[path] = st
    if not candidates:
        return []
    mapped, complete = _mapped_anywhere({(st.st_dev, st.st_ino) for st in candidates.values()})
    removed = []
    for path, st in candidates.items():
        if (st.st_dev, st.st_ino) in mapped or (not complete and st.st_mode & 0o066):
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


SERVER_FOLDER = "mpilaunch-pmix-{pid}-"  # an agent's PMIx server's folder (agent/services/pmix.py)
AGENTS_FOLDERS = "mpilaunch-pmix-"  # every agent's: a rank maps only its own agent's, which removes it


def server_base() -> str:
    """Where an agent's PMIx server keeps its files: /dev/shm, else $TMPDIR or /tmp."""
    return SHM_DIR if os.path.isdir(SHM_DIR) else os.environ.get("TMPDIR") or "/tmp"


def make_folder(prefix: str) -> str:
    """A new folder of this user only, named prefix + random letters, in server_base() (what
    tempfile.mkdtemp does, without its imports on a PMIx job's start)."""
    base = server_base()
    while True:
        path = os.path.join(base, prefix + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue


def remove_folder(path: str) -> None:
    """Remove a folder and all below it, ignoring what cannot be (shutil.rmtree's
    ignore_errors, without importing shutil and its compression modules); links are not
    followed."""
    for root, folders, files in os.walk(path, topdown=False):
        for name in files + [f for f in folders if os.path.islink(os.path.join(root, f))]:
            try:
                os.unlink(os.path.join(root, name))
            except OSError:
                pass
        for name in folders:
            try:
                os.rmdir(os.path.join(root, name))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass
