"""Hostile or unlucky files where the launcher writes (issue 27): device nodes, pipes and links at
the `--report-json` and `--rank-table` paths, FIFOs and devices in the log tree, two jobs on one
log tree.

Device nodes are made in a tmpfs: the cases that name /dev itself run in a mount namespace of
their own (`unshare --mount`) whose /dev is a fresh tmpfs holding the usual nodes, so that a
launcher that replaced /dev/null would replace only that namespace's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Launcher, write_script
from tests.smalldisk import fill, small_tmpfs

PY = sys.executable
PRIVATE_DEV = """
mount -t tmpfs -o size=1m,mode=755 tmpfs /dev
mknod -m 666 /dev/null c 1 3; mknod -m 666 /dev/zero c 1 5; mknod -m 666 /dev/full c 1 7
mknod -m 666 /dev/random c 1 8; mknod -m 666 /dev/urandom c 1 9
ln -s /proc/self/fd /dev/fd; ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout; ln -s /proc/self/fd/2 /dev/stderr
mkdir /dev/shm /dev/pts; mount -t tmpfs -o mode=1777 tmpfs /dev/shm
"""
NODES = {"/dev/null": (1, 3), "/dev/zero": (1, 5), "/dev/full": (1, 7)}


def run_in_private_dev(launcher: Launcher, script: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """script (sh) in a mount namespace whose /dev is private; $ML runs the launcher."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare(1) for a private /dev")
    env = {**launcher.env, "ML": f"{PY} -m mpilaunch"}
    return subprocess.run(
        [unshare, "--mount", "sh", "-ec", PRIVATE_DEV + script],
        env=env, cwd=launcher.tmp_path, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture(scope="module")
def private_dev() -> None:
    unshare = shutil.which("unshare")
    probe = subprocess.run(
        [unshare or "unshare", "--mount", "sh", "-ec", PRIVATE_DEV + "test -c /dev/null"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private /dev here: {probe.stderr.decode().strip()[-200:]}")


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A small tmpfs of the test's own, where device nodes may be made (mounted in this
    namespace, so that the launcher's agents and the bed's hosts see it too)."""
    with small_tmpfs(tmp_path / "fs", "1m") as where:
        yield where


def kind(path: Path | str) -> tuple[str, int, int]:
    """What a path is (not following a link), and a device's numbers."""
    found = os.lstat(path)
    names = {stat.S_IFCHR: "chr", stat.S_IFBLK: "blk", stat.S_IFIFO: "fifo", stat.S_IFSOCK: "sock",
             stat.S_IFLNK: "link", stat.S_IFDIR: "dir", stat.S_IFREG: "file"}  # fmt: skip
    return names[stat.S_IFMT(found.st_mode)], os.major(found.st_rdev), os.minor(found.st_rdev)


def documents(text: str) -> list[dict]:
    """The JSON documents in a stream (a report after rank lines)."""
    found, decoder, at = [], json.JSONDecoder(), text.find("{")
    while at >= 0:
        document, end = decoder.raw_decode(text, at)
        found.append(document)
        at = text.find("{", end)
    return found


# -- --report-json and --rank-table at a path that is not a regular file ------------------------------
@pytest.mark.parametrize("node", sorted(NODES))
def test_a_device_at_the_report_path_is_written_through_not_replaced(
    launcher: Launcher, private_dev: None, node: str
) -> None:
    """As root, `--report-json /dev/null` made /dev/null a regular file (the report was written
    beside it and renamed over it). Now /dev/null and /dev/zero take it, /dev/full refuses it in
    one line (ENOSPC) and the run's status stays the ranks'; every node is still itself."""
    quiet = "-mca orte_abort_on_non_zero_status 0"  # the other rank is not killed before it writes its line
    script = f'$ML -n 2 {quiet} --report-json {node} sh -c "echo rank \\$RANK; exit 3" || echo "status $?"\n'
    script += 'for n in /dev/null /dev/zero /dev/full; do stat -c "$n %F %t %T" $n; done\n'
    proc = run_in_private_dev(launcher, script)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "status 3" in out and sorted(line for line in out.splitlines() if line.startswith("rank")) == [
        "rank 0",
        "rank 1",
    ]
    for name, (major, minor) in NODES.items():
        assert f"{name} character special file {major:x} {minor:x}" in out, out
    if node == "/dev/full":
        assert "mpilaunch: --report-json: cannot write /dev/full: No space left on device" in err
    else:
        assert "--report-json" not in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("path", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", "/dev/stderr"])
@pytest.mark.parametrize("console", ["pipe", "file"])
def test_the_report_at_the_launchers_own_stdout_or_stderr(
    launcher: Launcher, private_dev: None, path: str, console: str
) -> None:
    """`--report-json /dev/stdout` printed nothing (its link was replaced by a file); now the
    report follows the rank output on that stream, a pipe or a regular file, which keeps what
    came before it, and /dev/stdout is still a link."""
    if path == "/dev/stderr":
        rank, redirect = ">&2", "2>&1 >/dev/null | cat > out.txt" if console == "pipe" else "2> out.txt"
    else:
        rank, redirect = "", "| cat > out.txt" if console == "pipe" else "> out.txt"
    script = f'$ML -n 2 --report-json {path} sh -c "echo rank \\$RANK {rank}" {redirect}\n'
    script += 'stat -c "%F" /dev/stdout /dev/stderr\n'
    proc = run_in_private_dev(launcher, script)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().split("\n")[:2] == ["symbolic link", "symbolic link"]
    text = (launcher.tmp_path / "out.txt").read_text()
    first = min(text.find("rank 0"), text.find("rank 1"))
    assert first >= 0 and "rank 0\n" in text and "rank 1\n" in text, text
    (report,) = documents(text[first:])
    assert report["outcome"] == "success" and report["exit_status"] == 0
    assert text.index("rank 0") < text.index('"mpilaunch"') and text.index("rank 1") < text.index('"mpilaunch"')


def test_the_rank_table_at_a_device_or_a_fifo(launcher: Launcher, private_dev: None, tmp_path: Path) -> None:
    """--rank-table /dev/null leaves /dev/null a device; a FIFO that a reader holds gets the table
    and stays a FIFO; a FIFO nobody reads is refused in one line before any rank starts (the
    launcher does not wait for a reader)."""
    proc = run_in_private_dev(launcher, '$ML -n 1 --rank-table /dev/null true\nstat -c "null %F %t %T" /dev/null\n')
    assert proc.returncode == 0, proc.stderr.decode()
    assert "null character special file 1 3" in proc.stdout.decode()
    fifo = tmp_path / "table.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        proc = launcher.run("-n", "1", "--rank-table", str(fifo), "true")
        assert proc.returncode == 0, proc.stderr.decode()
        assert json.loads(os.read(reader, 1 << 16))["server_count"] == "1"
    finally:
        os.close(reader)
    assert kind(fifo)[0] == "fifo"
    proc = launcher.run("-n", "1", "--rank-table", str(fifo), "touch", "ran", timeout=30)
    assert proc.returncode == 2 and not (tmp_path / "ran").exists()
    assert proc.stderr.decode() == f"mpilaunch: --rank-table: cannot write {fifo}: a FIFO that nobody reads\n"
    assert kind(fifo)[0] == "fifo"


def test_a_directory_a_block_device_or_a_socket_at_the_report_path(launcher: Launcher, tmpfs: Path) -> None:
    """Refused in one line each, left as they were, and the run's status is the ranks'."""
    os.mknod(tmpfs / "blk", 0o600 | stat.S_IFBLK, os.makedev(7, 200))  # a loop device number nothing uses
    (tmpfs / "dir").mkdir()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmpfs / "sock"))
    try:
        for name, words in (("blk", "a block device"), ("dir", "a directory"), ("sock", "a socket")):
            before = kind(tmpfs / name)
            proc = launcher.run("-n", "1", "--report-json", str(tmpfs / name), "sh", "-c", "exit 5")
            err = proc.stderr.decode()
            assert proc.returncode == 5, err
            assert f"mpilaunch: --report-json: cannot write {tmpfs / name}: {words}, not written\n" in err
            assert kind(tmpfs / name) == before
    finally:
        listener.close()


# -- the log tree ----------------------------------------------------------------------------------
def _plant(where: Path, what: str) -> None:
    where.parent.mkdir(parents=True, exist_ok=True)
    if what == "fifo":
        os.mkfifo(where)
    elif what == "chr":
        os.mknod(where, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # another /dev/null
    elif what == "sock":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(where))
        sock.close()
    elif what == "dir":
        where.mkdir()


@pytest.mark.parametrize(
    ("what", "name", "words"),
    [
        ("fifo", "1/rank.0/stdout", "a FIFO, not a regular file"),
        ("fifo", "1/rank.1/stderr", "a FIFO, not a regular file"),
        ("chr", "1/rank.0/stderr", "a character device, not a regular file"),
        ("sock", "1/rank.1/stdout", "a socket, not a regular file"),
        ("dir", "1/rank.0/stdout", "a directory, not a regular file"),
    ],
)
def test_a_fifo_or_a_device_in_the_log_tree_is_refused(
    launcher: Launcher, tmpfs: Path, what: str, name: str, words: str
) -> None:
    """`mkfifo D/1/rank.0/stdout` hung the launcher for ever before any rank started. Every log
    file is opened without waiting and must be a regular file: anything else is one line, status
    2, nothing started; a FIFO is refused even while someone reads it."""
    logs = tmpfs / "logs"
    where = logs / name
    reader = None
    _plant(where, what)
    if name.endswith("stderr") and what == "fifo":
        reader = os.open(where, os.O_RDONLY | os.O_NONBLOCK)  # someone reads it
    try:
        before = kind(where)
        proc = launcher.run("-n", "2", "--output-filename", str(logs), "touch", "ran", timeout=30)
    finally:
        if reader is not None:
            os.close(reader)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err == f"mpilaunch: --output-filename {logs}: cannot write {where}: {words}\n"
    assert kind(where) == before and not (launcher.tmp_path / "ran").exists()


WRITER = """
import os, sys, time
n = int(sys.argv[1])
print(os.environ["MPILAUNCH_JOB_ID"], flush=True)
for i in range(n):
    sys.stdout.write(f"line {i:07d} of rank {os.environ['RANK']}\\n")
    if i % 2000 == 0:
        sys.stdout.flush()
        time.sleep(0.01)
sys.stdout.flush()
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:  # the test's second jobs are done
    time.sleep(0.02)
"""


def _text_or_empty(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_a_second_job_on_one_log_tree_is_refused_naming_the_first(launcher: Launcher, tmp_path: Path) -> None:
    """Two jobs writing one --output-filename tree lost lines silently. The second job (by the
    same name, by an absolute name, through a link to the tree) is refused in one line that names
    the tree and the first job (its job id and pid); the first job's files have every line."""
    script = write_script(tmp_path, "writer.py", WRITER)
    lines = 100_000
    done = tmp_path / "done"
    first = launcher.popen(
        "-n", "2", "--output-filename", "logs", PY, script, str(lines), str(done), stdout=subprocess.DEVNULL
    )  # fmt: skip
    lock = tmp_path / "logs" / ".mpilaunch.lock"
    first_line = tmp_path / "logs" / "1" / "rank.0" / "stdout"
    deadline = time.monotonic() + 30
    while not (lock.exists() and lock.read_text().count(" ") == 1 and "\n" in _text_or_empty(first_line)):
        assert time.monotonic() < deadline and first.poll() is None, "the first job never took its tree"
        time.sleep(0.02)
    job_id = first_line.read_text().split("\n", 1)[0]
    (tmp_path / "link").symlink_to(tmp_path / "logs")
    try:
        for name in ("logs", str(tmp_path / "logs"), "link"):
            proc = launcher.run("-n", "1", "--output-filename", name, "echo", "second", timeout=30)
            err = proc.stderr.decode()
            assert proc.returncode == 2 and proc.stdout == b"", err
            assert err == (
                f"mpilaunch: --output-filename {name}: job {job_id} (mpilaunch, pid {first.pid}) is writing its rank "
                "output there; two jobs in one log tree lose lines: wait for it to end, or give another directory\n"
            )
        done.write_text("")
        assert first.wait(timeout=120) == 0
    finally:
        if first.poll() is None:
            first.kill()
        first.wait()
    for rank in (0, 1):
        text = (tmp_path / "logs" / "1" / f"rank.{rank}" / "stdout").read_text().splitlines()
        assert text[1:] == [f"line {i:07d} of rank {rank}" for i in range(lines)]
    assert sorted(os.listdir(tmp_path / "logs")) == ["1"]  # the lock's file goes with its job


def test_a_killed_jobs_lock_does_not_block_the_next(launcher: Launcher, tmp_path: Path) -> None:
    """The lock dies with its holder: after `kill -9` of the launcher the next job takes the tree
    (and removes the file the killed one left). A link or a FIFO planted at the lock's name is
    refused, not followed and not waited on."""
    proc = launcher.popen("-n", "1", "--output-filename", "logs", "sleep", "30")
    lock = tmp_path / "logs" / ".mpilaunch.lock"
    deadline = time.monotonic() + 30
    while not (lock.exists() and lock.read_text().count(" ") == 1):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert lock.exists()  # left by the killed launcher; its lock went with it
    again = launcher.run("-n", "1", "--output-filename", "logs", "echo", "next")
    assert again.returncode == 0, again.stderr.decode()
    assert (tmp_path / "logs" / "1" / "rank.0" / "stdout").read_text() == "next\n"
    assert sorted(os.listdir(tmp_path / "logs")) == ["1"]
    for planted in ("link", "fifo"):
        if planted == "link":
            lock.symlink_to(tmp_path / "victim")
        else:
            os.mkfifo(lock)
        refused = launcher.run("-n", "1", "--output-filename", "logs", "touch", "ran", timeout=30)
        words = "a symbolic link, not followed" if planted == "link" else "a FIFO, not a regular file"
        assert refused.returncode == 2
        assert refused.stderr.decode() == f"mpilaunch: --output-filename logs: cannot write {lock}: {words}\n"
        assert not (tmp_path / "victim").exists() and not (tmp_path / "ran").exists()
        lock.unlink()


def test_a_fifo_at_a_hydra_pattern_file_is_refused(launcher: Launcher, tmp_path: Path) -> None:
    """hydra's -outfile-pattern files are log files too: a FIFO there is one line, not a hang;
    a link of the user's own is followed (the path is theirs, as with hydra)."""
    os.mkfifo(tmp_path / "out.0")
    proc = launcher.run("-outfile-pattern", "out.%r", "-n", "1", "touch", "ran", timeout=30)
    assert proc.returncode == 2 and not (tmp_path / "ran").exists()
    said = "mpilaunch: -outfile-pattern out.%r: cannot write out.0: a FIFO, not a regular file\n"
    assert proc.stderr.decode() == said
    (tmp_path / "out.0").unlink()
    (tmp_path / "kept.txt").write_text("old\n")
    (tmp_path / "out.0").symlink_to(tmp_path / "kept.txt")
    proc = launcher.run("-outfile-pattern", "out.%r", "-n", "1", "echo", "new", timeout=30)
    assert proc.returncode == 0, proc.stderr.decode()
    assert (tmp_path / "kept.txt").read_text() == "new\n"


# -- what the launcher reads and the files it makes besides a run's (issue 35) ----------------------
REPORT = {"mpilaunch": "0.1.0", "schema": 1, "outcome": "success", "exit_status": 0, "ranks": []}


@pytest.mark.parametrize("what", ["fifo", "chr", "dir", "sock"])
def test_a_shims_folder_with_a_fifo_or_a_device_named_as_a_shim(launcher: Launcher, tmpfs: Path, what: str) -> None:
    """`mpilaunch shims DIR` opened each shim's name to see whether it was one of its own: a FIFO
    there held it for ever. Now anything but a regular file is left alone, in one line."""
    folder = tmpfs / "bin"
    _plant(folder / "mpiexec", what)
    before = kind(folder / "mpiexec")
    proc = launcher.run("shims", str(folder), timeout=30)
    words = {"fifo": "a FIFO", "chr": "a character device", "dir": "a directory", "sock": "a socket"}[what]
    assert proc.returncode == 2, proc.stderr.decode()
    said = f"mpilaunch: shims: {folder / 'mpiexec'} exists and is {words}, not a file; it is left as it is\n"
    assert proc.stderr.decode() == said
    assert kind(folder / "mpiexec") == before


@pytest.mark.parametrize("what", ["fifo", "chr", "dir"])
def test_the_report_page_at_a_fifo_or_a_device_is_refused(launcher: Launcher, tmpfs: Path, what: str) -> None:
    """`mpilaunch report RUN.json -o X.html` with a FIFO at X.html waited for a reader for ever;
    a device took the page. Each is refused in one line and left as it was."""
    (tmpfs / "run.json").write_text(json.dumps(REPORT))
    target = tmpfs / "x.html"
    _plant(target, what)
    before = kind(target)
    proc = launcher.run("report", str(tmpfs / "run.json"), "-o", str(target), timeout=30)
    words = {"fifo": "a FIFO", "chr": "a character device", "dir": "a directory"}[what]
    assert proc.returncode == 2 and proc.stderr.decode() == (
        f"mpilaunch: report: cannot write {target}: {words}, not a regular file\n"
    )
    assert kind(target) == before


def test_the_report_page_on_a_full_disk_leaves_the_old_page_whole(launcher: Launcher, tmpfs: Path) -> None:
    """On a full disk the page was cut to 0 bytes (opened with truncation, then the write
    failed): the last good page was lost. Now it is written beside and renamed: the old page
    stays whole, nothing partial is left, one line, status 2. With room, a link is followed."""
    (tmpfs / "run.json").write_text(json.dumps(REPORT))
    old = "<html>the last good page</html>\n"
    (tmpfs / "x.html").write_text(old)
    fill(tmpfs / "filler")
    proc = launcher.run("report", str(tmpfs / "run.json"), "-o", str(tmpfs / "x.html"))
    assert proc.returncode == 2
    assert proc.stderr.decode() == f"mpilaunch: report: cannot write {tmpfs / 'x.html'}: No space left on device\n"
    assert (tmpfs / "x.html").read_text() == old
    assert sorted(os.listdir(tmpfs)) == ["filler", "run.json", "x.html"]
    (tmpfs / "filler").unlink()
    (tmpfs / "link.html").symlink_to(tmpfs / "x.html")
    proc = launcher.run("report", str(tmpfs / "run.json"), "-o", str(tmpfs / "link.html"))
    assert proc.returncode == 0, proc.stderr.decode()
    assert (tmpfs / "link.html").is_symlink() and "<!DOCTYPE html>" in (tmpfs / "x.html").read_text()


@pytest.mark.parametrize("where", ["/dev/full", "read-only"])
def test_a_report_that_cannot_be_written_fails_a_run_that_succeeded(
    launcher: Launcher, tmp_path: Path, where: str
) -> None:
    """`--report-json /dev/full` said it could not write the report and exited 0: a CI system
    read success and found no report. Now a run whose ranks succeeded exits 2 (a failed run keeps
    its ranks' status: test_a_device_at_the_report_path_is_written_through_not_replaced), and
    --max-restarts does not start the job again for it."""
    path = where
    if where == "read-only":
        (tmp_path / "ro").mkdir()
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(tmp_path / "ro")])
        if made.returncode != 0:
            pytest.skip("cannot mount a read-only tmpfs here")
        path = str(tmp_path / "ro" / "report.json")
    try:
        proc = launcher.run("--max-restarts", "2", "--report-json", path, "-n", "2", "sh", "-c", "echo ran")
    finally:
        if where == "read-only":
            subprocess.run(["umount", "-l", str(tmp_path / "ro")], check=True)
    why = "No space left on device" if where == "/dev/full" else "Read-only file system"
    assert proc.returncode == 2 and proc.stdout == b"ran\nran\n", proc.stderr.decode()
    assert proc.stderr.decode() == f"mpilaunch: --report-json: cannot write {path}: {why}\n"


@pytest.mark.parametrize(
    "args",
    [("--hostfile", "F", "-n", "1", "true"), ("--config", "F", "true"), ("--app", "F"), ("report", "F", "-o", "x.html"),
     ("-n", "1", "--tune", "F", "true")],
    ids=["hostfile", "job-file", "app-file", "report", "tune"],
)  # fmt: skip
def test_a_fifo_that_nobody_writes_is_refused_not_waited_on(launcher: Launcher, tmp_path: Path, args: tuple) -> None:
    """A hostfile, job file, app file, --tune file or report document that is a FIFO nobody
    writes held the launcher in `open` for ever. Now: one line, status 2."""
    os.mkfifo(tmp_path / "F")
    proc = launcher.run(*args, timeout=30)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, err
    assert err.endswith("F: cannot read " + err.split("F: cannot read ", 1)[1])
    assert err.rstrip("\n").endswith(": a FIFO or pipe with nothing to read (nobody writes it)"), err


def test_a_hostfile_from_a_pipe_is_still_read_and_a_device_is_refused(launcher: Launcher, tmp_path: Path) -> None:
    """`--hostfile <(...)` (a pipe its writer fills, then closes) is read as before; a terminal or
    another device is refused rather than read (a terminal would be waited on)."""
    read_end, write_end = os.pipe()
    writer = subprocess.Popen(["sh", "-c", "sleep 0.5; echo localhost slots=2"], stdout=write_end)
    os.close(write_end)
    try:
        proc = launcher.run("--hostfile", f"/dev/fd/{read_end}", "-n", "2", "echo", "ok", pass_fds=(read_end,))
    finally:
        os.close(read_end)
        writer.wait()
    assert proc.returncode == 0 and proc.stdout == b"ok\nok\n", proc.stderr.decode()
    proc = launcher.run("--hostfile", "/dev/zero", "-n", "1", "true", timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.decode() == "mpilaunch: /dev/zero: cannot read hostfile: a character device, not a file\n"
