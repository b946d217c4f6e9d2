"""Hostile input: garbage on the agent's link (fuzzed in process, and fed to a real agent process,
which must stop cleanly and kill its ranks), frames an agent might send the controller, host and
user names built to be read as shell or options (refused before any SSH connection), secrets in
`--dry-run` and other output, symbolic links planted in a log directory, bad `--output-filename`.

The parsers of hostfiles, `-H`, PMI-1 and PMI-2 are fuzzed where they are tested (test_hosts,
test_mpi, test_pmi2); docs/reliability.md lists them all.
"""

from __future__ import annotations

import os
import re
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpilaunch.protocol import wire
from tests.conftest import ROOT, Launcher, tagged_pids

PY = sys.executable
TREE = str(ROOT / "tests" / "ranks" / "tree.py")
_HEAD = struct.Struct(">IB")
DEEP = _HEAD.pack(100_001, wire.CONTROL) + b"[" * 100_000  # JSON nested deeper than the parser recurses


def raw(kind: int, body: bytes) -> bytes:
    """A frame with any body, valid or not."""
    return _HEAD.pack(len(body) + 1, kind) + body


GARBAGE = {
    "length out of range": b"\xff\xff\xff\xff\x00",
    "zero length": bytes(5),
    "unknown kind": raw(9, b""),
    "not JSON": raw(wire.CONTROL, b"{x}"),
    "JSON not an object": raw(wire.CONTROL, b"[1]"),
    "no op": raw(wire.CONTROL, b'{"x":1}'),
    "nested too deep": DEEP,
    "short data frame": raw(wire.OUTPUT, b"x"),
    "launch without ranks": wire.control("launch"),
    "launch with a string for ranks": wire.control("launch", job=1, ranks="abc"),
    "kill with a word for grace": wire.control("kill", grace="soon"),
    "signal out of range": wire.control("signal", sig=999),
    "truncated frame, then EOF": raw(wire.CONTROL, b'{"op":"ping"}')[:-3],
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_agent_fed_garbage_stops_and_kills_its_ranks(launcher: Launcher, tmp_path: Path, name: str) -> None:
    """A real agent process (as on a remote host: its link is stdin and stdout) runs a rank with a
    daemonized tree, then gets garbage: it says why on stderr, kills the whole tree and exits 0.
    The `launcher` fixture fails the test if any process carrying its tag is left."""
    marks = tmp_path / "marks"
    marks.mkdir()
    agent = subprocess.Popen(
        [PY, "-c", "from mpilaunch.agent.agent import serve_stdio; raise SystemExit(serve_stdio())"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=launcher.env,
    )  # fmt: skip
    assert agent.stdin is not None and agent.stdout is not None and agent.stderr is not None
    rank = {"proc": 0, "rank": 0, "local_rank": 0, "app": 0, "argv": [PY, TREE, str(marks), "sleep"],
            "wdir": str(tmp_path), "env": {"RANK": "0"}, "stdin": False}  # fmt: skip
    agent.stdin.write(wire.control("launch", job=1, ranks=[rank], env={}, merge=False, bind_to="none", pmi=None))
    agent.stdin.flush()
    decoder = wire.Decoder()
    output = b""
    deadline = time.monotonic() + 30
    while b"up 0" not in output:
        assert time.monotonic() < deadline and select.select([agent.stdout], [], [], 30)[0], "the rank never came up"
        chunk = os.read(agent.stdout.fileno(), 1 << 16)
        assert chunk, agent.stderr.read().decode()
        output += b"".join(v[2] for k, v in decoder.feed(chunk) if k == wire.OUTPUT)  # type: ignore[index]
    time.sleep(0.6)  # the agent has looked for adopted orphans since
    agent.stdin.write(GARBAGE[name])
    agent.stdin.flush()
    if name.endswith("EOF"):
        agent.stdin.close()
    sent = time.monotonic()
    try:
        status = agent.wait(timeout=15)
    finally:
        agent.kill()
        agent.wait()
    err = agent.stderr.read().decode()
    assert status == 0, err
    assert "Traceback" not in err
    if not name.endswith("EOF"):
        assert re.search(r"mpilaunch agent: .*; stopping", err), err
    while tagged_pids(launcher.tag) and time.monotonic() - sent < 5:
        time.sleep(0.05)
    assert not tagged_pids(launcher.tag), "the rank's tree outlived its agent"
    assert sorted(os.listdir(marks)) == ["0.child", "0.daemon", "0.worker"]


# -- names that would be shell or options --------------------------------------------------------
class Listener:
    """A TCP port that counts connections: proof that no SSH connection was attempted."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.9", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def mute(tmp_path: Path) -> Iterator[tuple[Listener, Path]]:
    listener = Listener()
    config = tmp_path / "ssh_config"
    config.write_text(f"Host mute\n    HostName 127.0.0.9\n    Port {listener.port}\n    ConnectTimeout 2\n")
    yield listener, config
    listener.close()


BAD_HOSTS = {
    "command substitution": ["-H", "mute:1,$(touch pwned):1"],
    "backquotes": ["-H", "mute:1,`touch pwned`:1"],
    "a space": ["-H", "mute:1,a b:1"],
    "an option": ["-H", "mute:1,-oProxyCommand=touch pwned:1"],
    "a semicolon in a hostfile": "mute slots=1\nevil;touch pwned slots=1\n",
    "an option in a hostfile": "mute slots=1\n-oProxyCommand=touch slots=1\n",
    "a user that is an option": ["-H", "mute:1,-oProxyCommand=x@node:1"],
    "a user with a space in a hostfile": "mute slots=1\nnode slots=1 user=a;b\n",
    "a user from command substitution": "mute slots=1\n$(id)@node slots=1\n",
}


@pytest.mark.parametrize("name", sorted(BAD_HOSTS))
def test_hostile_host_and_user_names_are_refused_before_any_ssh(
    launcher: Launcher, tmp_path: Path, mute: tuple[Listener, Path], name: str
) -> None:
    listener, config = mute
    spec = BAD_HOSTS[name]
    if isinstance(spec, str):
        (tmp_path / "hosts").write_text(spec)
        spec = ["--hostfile", str(tmp_path / "hosts")]
    proc = launcher.run("--ssh-config", str(config), *spec, "-n", "2", "touch", "ran")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert re.search(r"invalid (host|user) name", err), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert listener.accepted == 0, "an SSH connection was attempted"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    ("line", "words"),
    [("User -oProxyCommand=touch", "invalid user name"), ("ProxyJump -oProxyCommand=x", "ProxyJump")],
)
def test_hostile_names_in_the_ssh_config_are_refused_before_connecting(
    launcher: Launcher, tmp_path: Path, mute: tuple[Listener, Path], line: str, words: str
) -> None:
    listener, config = mute
    config.write_text(config.read_text() + f"    {line}\n")
    proc = launcher.run("--ssh-client", "paramiko", "--ssh-config", str(config), "-H", "mute:1", "-n", "1", "true")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert words in err and "Traceback" not in err
    assert listener.accepted == 0
    # OpenSSH's client reads the config itself: the value never reaches a command line, so
    # nothing is run; the host just fails (the mute listener speaks no SSH)
    proc = launcher.run("--ssh-client", "openssh", "--ssh-config", str(config), "-H", "mute:1", "-n", "1", "touch",
                        str(tmp_path / "ran"))  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr.decode()
    assert not (tmp_path / "ran").exists() and not list(tmp_path.glob("*pwned*"))


# -- secrets ---------------------------------------------------------------------------------------
SECRETS = {"API_TOKEN": "tok-1111", "my_secret": "sec-2222", "DB_PASSWORD": "pw-3333", "SSH_KEY": "key-4444"}


def test_secret_names_are_masked_in_dry_run_and_other_output(launcher: Launcher) -> None:
    exports = [a for name in SECRETS for a in ("-x", name if name == "SSH_KEY" else f"{name}={SECRETS[name]}")]
    env = {"SSH_KEY": SECRETS["SSH_KEY"]}  # taken from the environment by `-x SSH_KEY`
    dry = launcher.run("--dry-run", "-H", "a:2,b:2", "-n", "4", *exports, "true", env=env)
    text = dry.stdout.decode() + dry.stderr.decode()
    assert dry.returncode == 0, text
    for name, value in SECRETS.items():
        assert value not in text
        assert text.count(f"  {name}=****") == 4  # every rank's listing
    assert "  RANK=0" in text  # other values are shown
    # the map, the bindings report and a failure summary do not show the environment at all
    run = launcher.run(
        "--display-map", "--report-bindings", "-n", "2", *exports, "sh", "-c", 'echo failing >&2; exit "$RANK"', env=env
    )
    text = run.stdout.decode() + run.stderr.decode()
    assert run.returncode == 1 and "failing" in text and "JOB MAP" in text
    assert not [value for value in SECRETS.values() if value in text]


# -- log files ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["1", "1/rank.0", "1/rank.0/stdout", "1/rank.1/stderr"])
def test_a_symlink_planted_in_the_log_tree_is_not_followed(launcher: Launcher, tmp_path: Path, where: str) -> None:
    """A link at any name the launcher builds (job, rank directory, file) refuses the run before
    anything starts, and whatever it points to is left alone."""
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("stdout", "stderr"):
        (victim / name).write_text("precious\n")
    logs = tmp_path / "logs"
    link = logs / where
    link.parent.mkdir(parents=True)
    link.symlink_to(victim if not where.endswith(("stdout", "stderr")) else victim / link.name)
    proc = launcher.run("-n", "2", "--output-filename", str(logs), "touch", str(tmp_path / "ran"))
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert f"cannot write {link}: a symbolic link, not followed" in err
    assert sorted(os.listdir(victim)) == ["stderr", "stdout"]
    assert all((victim / n).read_text() == "precious\n" for n in ("stdout", "stderr"))
    assert not (tmp_path / "ran").exists()


def test_the_log_directory_itself_may_be_a_symlink(launcher: Launcher, tmp_path: Path) -> None:
    """DIR is the user's own choice (another disk, say); the names below it are numbers only."""
    (tmp_path / "disk").mkdir()
    (tmp_path / "logs").symlink_to(tmp_path / "disk")
    proc = launcher.run("-n", "2", "--output-filename", "logs", "sh", "-c", "echo $RANK")
    assert proc.returncode == 0, proc.stderr.decode()
    found = sorted(str(p.relative_to(tmp_path / "disk")) for p in (tmp_path / "disk").rglob("*"))
    assert found == ["1", "1/rank.0", "1/rank.0/stderr", "1/rank.0/stdout", "1/rank.1", "1/rank.1/stderr",
                     "1/rank.1/stdout"]  # fmt: skip
    assert all(re.fullmatch(r"\d+(/rank\.\d+(/std(out|err))?)?", name) for name in found)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "the directory name is empty"),
        (":nocopy", "the directory name is empty"),
        ("afile/sub", "Not a directory"),
        ("/proc/forbidden", "cannot write /proc/forbidden"),
        ("/sys/forbidden", "cannot write /sys/forbidden"),
    ],
)
def test_bad_output_filename_fails_before_launch(launcher: Launcher, tmp_path: Path, value: str, words: str) -> None:
    """Refused with one line, status 2, before any rank starts. (With remote hosts the log tree is
    opened once every host passed its checks, so that a refused job leaves no files.)"""
    (tmp_path / "afile").write_text("")
    proc = launcher.run("-n", "2", "--output-filename", value, "touch", "ran")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and words in err, err
    assert not (tmp_path / "ran").exists()
