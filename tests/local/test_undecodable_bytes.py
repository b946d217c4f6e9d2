"""Bytes that are not UTF-8 in what a run prints or stores (issue 27, item 2): in a rank's
arguments, an environment value, a working directory, a program, a host name, a log directory,
the report's own path.

`mpilaunch -n 1 sh -c 'exit 3' $'caf\\xe9.txt'` ended in a UnicodeEncodeError traceback, without
its summary or report, with status 1. Now the console gets those bytes as they came, the JSON
report holds them as `\\udcXX` escapes (ASCII; Python's os.fsencode gives the bytes back), and
the status is the ranks'. Every run here forces strict encoding on the launcher's streams
(PYTHONIOENCODING), as a UTF-8 locale other than C.UTF-8 gives it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.conftest import Launcher

PY = sys.executable
STRICT = {"PYTHONIOENCODING": "utf-8:strict"}
# Latin-1, a lone continuation pair, a bad continuation, an encoded surrogate, an overlong slash,
# a 5-byte form, a cut 3-byte sequence.
INVALID = [b"caf\xe9", b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80", b"\xe2\x82"]


def run(launcher: Launcher, *args: str | bytes, **kw) -> tuple[int, bytes, bytes]:
    proc = launcher.run(*args, env={**STRICT, **kw.pop("env", {})}, **kw)  # type: ignore[arg-type]
    assert b"Traceback" not in proc.stderr, proc.stderr.decode(errors="replace")
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("bad", INVALID, ids=[b.hex() for b in INVALID])
def test_a_failed_rank_with_such_an_argument(launcher: Launcher, tmp_path: Path, bad: bytes) -> None:
    """Its summary (with the argument's bytes as they are), its report (lossless) and its status:
    an exit code, a signal, the timeout."""
    word = b"file-" + bad + b".txt"
    for command, status in (
        (["sh", "-c", "exit 3"], 3),
        (["sh", "-c", "kill -SEGV $$"], 128 + signal.SIGSEGV),
        (["--timeout", "1", "sh", "-c", "sleep 30"], 124),
    ):
        report = tmp_path / "report.json"
        code, _, err = run(launcher, "--report-json", str(report), "-n", "2", *command, word)
        assert code == status, err.decode(errors="replace")
        document = json.loads(report.read_text(encoding="ascii"))
        assert document["exit_status"] == status
        assert os.fsencode(document["command"][-1]) == word
        if status != 124:
            assert b"  Command:   sh -c " in err and word in err.split(b"  Command:   ", 1)[1].split(b"\n", 1)[0]
            assert os.fsencode(document["first_failure"]["command"][-1]) == word
        else:
            assert b"the job exceeded --timeout 1 s" in err


def test_an_environment_value_and_a_working_directory(launcher: Launcher, tmp_path: Path) -> None:
    """-x NAME=value, -x NAME from the launcher's environment, and --wdir: the rank gets the bytes
    (its own files say so), the dry run shows them, the failure is reported."""
    value = b"v-" + b"".join(INVALID)
    wdir = tmp_path / os.fsdecode(b"dir-\xe9\xff")
    wdir.mkdir()
    env = {"FROM_LAUNCHER": os.fsdecode(value)}
    script = 'printf %s "$GIVEN" > given; printf %s "$FROM_LAUNCHER" > carried; pwd > where; exit 4'
    args = ("-x", b"GIVEN=" + value, "-x", "FROM_LAUNCHER", "--wdir", os.fsencode(wdir), "-n", "1", "sh", "-c", script)
    code, _, err = run(launcher, *args, env=env)
    assert code == 4 and b"Exit code: 4" in err
    assert (wdir / "given").read_bytes() == value and (wdir / "carried").read_bytes() == value
    assert (wdir / "where").read_bytes() == os.fsencode(wdir) + b"\n"
    code, out, err = run(launcher, "--dry-run", *args, env=env)
    assert code == 0, err
    assert b"  GIVEN=" + value + b"\n" in out and b"  FROM_LAUNCHER=" + value + b"\n" in out


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--wdir", b"/nonexistent/d\xe9"), "working directory '/nonexistent/d\\udce9' does not exist"),
        (("-H", b"node\xe9:1"), "invalid host name"),
        (("-H", b"localhost:1,\xff\xfe"), "invalid host name"),
        ((b"/nonexistent/prog\xe9",), "program '/nonexistent/prog\\udce9' not found"),
    ],
    ids=["wdir", "host", "second-host", "program"],
)
def test_such_bytes_in_bad_input_are_one_line(launcher: Launcher, args: tuple, words: str) -> None:
    code, out, err = run(launcher, "-n", "1", *args, *([] if len(args) == 1 else ["true"]))
    assert code == 2 and out == b"", err
    assert len(err.splitlines()) == 1 and words.encode() in err, err


def test_a_hostfile_line_that_is_not_utf8(launcher: Launcher, tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_bytes(b"localhost slots=2\nnode\xe9 slots=2\n")
    code, _, err = run(launcher, "--hostfile", str(hostfile), "-n", "1", "true")
    assert code == 2 and err == f"mpilaunch: {hostfile}:2: not UTF-8 text\n".encode()


def test_a_log_directory_and_a_report_path_named_with_such_bytes(launcher: Launcher, tmp_path: Path) -> None:
    logs = os.fsencode(tmp_path) + b"/logs-\xe9\xc3\x28"
    report = os.fsencode(tmp_path) + b"/report-\xff.json"
    code, out, err = run(launcher, "--output-filename", logs, "--report-json", report, "-n", "1", "sh", "-c", "echo x")
    assert code == 0, err
    assert b"mpilaunch: rank output goes to " + logs + b"/1/rank.N\n" in err
    assert Path(os.fsdecode(logs + b"/1/rank.0/stdout")).read_text() == "x\n" and out == b"x\n"
    assert json.loads(Path(os.fsdecode(report)).read_text())["outcome"] == "success"
