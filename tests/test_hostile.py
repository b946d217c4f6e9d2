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
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mpilaunch.agent.agent import Agent
from mpilaunch.agent.services.pmi1 import ProtocolError, parse_line
from mpilaunch.agent.services.pmi_server import JobServer
from mpilaunch.cli.parse import parse_args
from mpilaunch.launcher.controller import Controller
from mpilaunch.launcher.here import ThisMachine
from mpilaunch.launcher.links import HostLink
from mpilaunch.launcher.output import OutputSink
from mpilaunch.plan.build import build_plan
from mpilaunch.protocol import wire
from mpilaunch.protocol.messages import PmiJob, encode
from mpilaunch.transport.base import Link

from .conftest import ROOT, Launcher, tagged_pids

PY = sys.executable
TREE = str(ROOT / "tests" / "ranks" / "tree.py")
_HEAD = struct.Struct(">IB")
DEEP = _HEAD.pack(100_001, wire.CONTROL) + b"[" * 100_000  # JSON nested deeper than the parser recurses


def raw(kind: int, body: bytes) -> bytes:
    """A frame with any body, valid or not."""
    return _HEAD.pack(len(body) + 1, kind) + body


# -- the frame decoder -------------------------------------------------------------------------
_frames = st.one_of(
    st.builds(
        wire.output, st.integers(0, 2**32 - 1), st.sampled_from([wire.STDOUT, wire.STDERR]), st.binary(max_size=40)
    ),
    st.builds(wire.stdin, st.integers(0, 2**32 - 1), st.binary(max_size=40)),
    st.builds(
        lambda op, fields: wire.control(op, **fields),
        st.text(max_size=8),
        st.dictionaries(
            st.text(max_size=4).filter(lambda k: k != "op"), st.integers() | st.text(max_size=6), max_size=3
        ),
    ),
    st.binary(max_size=24),  # garbage between frames
    st.builds(raw, st.integers(0, 255), st.binary(max_size=16)),  # any kind, any body
)


def decode_in_pieces(data: bytes, cuts: list[int]) -> tuple[list, bool]:
    """Frames decoded when data arrives cut at these offsets, and whether a FrameError came."""
    decoder = wire.Decoder()
    frames: list = []
    start = 0
    for end in [*sorted(cuts), len(data)]:
        try:
            frames += decoder.feed(data[start:end])
        except wire.FrameError:
            return frames, True
        start = max(start, end)
    return frames, False


@given(st.lists(_frames, max_size=8), st.lists(st.integers(0, 600), max_size=10))
@example([DEEP], [])
@example([DEEP], [3, 50])
@settings(max_examples=400, deadline=None)
def test_fuzz_decoder_any_bytes_any_chunking(pieces: list[bytes], cuts: list[int]) -> None:
    """Any bytes, cut anywhere: whole frames or FrameError, never another exception, and the
    same outcome however the bytes were cut."""
    data = b"".join(pieces)
    whole, whole_failed = decode_in_pieces(data, [])
    cut, cut_failed = decode_in_pieces(data, cuts)
    assert whole_failed == cut_failed
    if not whole_failed:
        assert cut == whole
        assert all(kind in (wire.CONTROL, wire.OUTPUT, wire.STDIN) for kind, _ in whole)


def test_json_nested_too_deep_is_a_frame_error() -> None:
    with pytest.raises(wire.FrameError):
        wire.Decoder().feed(DEEP)


# -- PMI-1: the line parser and a stream in any chunking -----------------------------------------
@given(st.binary(max_size=200))
@settings(max_examples=500)
def test_fuzz_pmi1_line_parser_only_raises_protocol_error(data: bytes) -> None:
    try:
        fields = parse_line(data)
    except ProtocolError:
        return
    assert fields["cmd"]


PMI1_JOB = PmiJob(job=1, size=1, universe=1, kvsname="kvs_h_1", mapping="(vector,(0,1,1))", preput={})
PMI1_FIXED = [b"cmd=init pmi_version=1 pmi_subversion=1\n", b"cmd=get_maxes\n", b"cmd=get_appnum\n"]
PMI1_FIXED += [b"cmd=get_my_kvsname\n", b"cmd=get_universe_size\n", b"cmd=bogus a=b\n", b"cmd=finalize\n"]
_pmi1_lines = st.one_of(
    st.sampled_from(PMI1_FIXED),
    st.builds(
        lambda cmd, key, value: f"cmd={cmd} kvsname=kvs_h_1 key={key} value={value}\n".encode(),
        st.sampled_from(["put", "get"]),
        st.sampled_from(["a", "b", "PMI_process_mapping", ""]),
        st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
    ),
    st.binary(max_size=30),
)


def _serve_pmi1(pieces: list[bytes]) -> tuple[bytes, list, bool]:
    """What a job's PMI server answers a rank sending these pieces, what it sends up, and if it hung up."""
    sent: list[bytes] = []
    service = JobServer(PMI1_JOB, lambda message: sent.append(encode(message)))
    ours, theirs = service.attach(0, 0, 0)
    theirs.setblocking(False)
    replies = b""
    alive = True
    try:
        for piece in pieces:
            theirs.sendall(piece)
            alive = service.readable(ours.fileno())
            try:
                while chunk := theirs.recv(1 << 16):
                    replies += chunk
            except BlockingIOError:
                pass
            if not alive:
                break
    finally:
        ours.close()
        theirs.close()
    return replies, wire.Decoder().feed(b"".join(sent)), alive


@given(st.lists(_pmi1_lines, min_size=1, max_size=8), st.lists(st.integers(1, 40), max_size=8))
@settings(max_examples=300, deadline=None)
def test_fuzz_pmi1_stream_in_any_chunking(lines: list[bytes], sizes: list[int]) -> None:
    """A PMI-1 stream, sane or not, gets the same replies and reports however it is cut."""
    data = b"".join(lines)
    pieces, pos = [], 0
    for size in [*sizes, len(data)]:
        if pos < len(data):
            pieces.append(data[pos : pos + size])
            pos += size
    assert _serve_pmi1(pieces) == _serve_pmi1([data])


# -- the agent, in process ----------------------------------------------------------------------
class FakeLink:
    """Stands for the agent's link: recv hands out what a test queued, sendall records."""

    def __init__(self) -> None:
        self.inbox: list[bytes] = []
        self.sent: list[bytes] = []

    def fileno(self) -> int:
        return 0

    def recv(self, size: int) -> bytes:
        return self.inbox.pop(0) if self.inbox else b""

    def sendall(self, data: bytes) -> None:
        self.sent.append(data)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
# Every operation the controller sends but `launch` and `check`, which start processes or probe ports.
_AGENT_OPS = ["signal", "kill", "finish", "ping", "pmi_fence_done", "pmi_name_reply", "pmi_spawn_reply", "x"]
_agent_frames = st.one_of(
    st.builds(
        lambda op, fields: wire.control(op, **fields),
        st.sampled_from(_AGENT_OPS),
        st.dictionaries(st.sampled_from(["sig", "grace", "job", "req", "kvs", "fields", "rc", "msg", "cmd"]), _json),
    ),
    st.builds(wire.stdin, st.integers(0, 2**32 - 1), st.binary(max_size=20)),
    st.binary(max_size=20),
)


@given(st.lists(_agent_frames, min_size=1, max_size=6), st.lists(st.integers(1, 80), max_size=6))
@settings(max_examples=300, deadline=None)
def test_fuzz_agent_link_never_raises(frames: list[bytes], sizes: list[int]) -> None:
    """Whatever the link carries, the agent handles it or stops as if the link were lost."""
    link = FakeLink()
    data = b"".join(frames)
    pos = 0
    for size in [*sizes, len(data)]:
        if pos < len(data):
            link.inbox.append(data[pos : pos + size])
            pos += size
    agent = Agent(link)  # type: ignore[arg-type]
    agent.reaper.adopted = lambda: []  # type: ignore[method-assign]  # this test process's children are not orphans
    try:
        while link.inbox and agent.link_open:
            agent.read_link(link.fileno())
    finally:
        agent.loop.close()


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
    agent.stdin.write(wire.control("launch", job=1, ranks=[rank], merge=False, bind_to="none", pmi=None))
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


# -- the controller: frames an agent might send ---------------------------------------------
class FakeAgentLink(Link):
    """A remote agent's link as the controller sees it, replaying queued bytes."""

    def __init__(self) -> None:
        super().__init__("fake")
        self.inbox: list[bytes] = []
        self.sent: list[bytes] = []
        self.closed = False
        self.r, self.w = socket.socketpair()

    def fileno(self) -> int:
        return self.r.fileno()

    def recv(self) -> bytes | None:
        return self.inbox.pop(0) if self.inbox else b""

    def send(self, frame: bytes) -> None:
        self.sent.append(frame)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.r.close()
            self.w.close()

    def wait(self) -> None:
        pass

    def readable(self) -> bool:
        return False

    def ping_every(self, period: float, frame: bytes) -> None:
        pass


_CONTROLLER_OPS = ["started", "exited", "failed", "stdin_ack", "note", "pmi_fence", "pmi_abort", "pmi_error",
                   "pmi_name", "pmi_spawn", "hello", "ping", "bye", "x"]  # fmt: skip
_proc = st.one_of(st.integers(-3, 5), st.text(max_size=3), st.none())
_controller_frames = st.one_of(
    st.builds(
        lambda op, proc, fields: wire.control(op, proc=proc, **fields),
        st.sampled_from(_CONTROLLER_OPS),
        _proc,
        st.dictionaries(
            st.sampled_from(["pid", "status", "code", "error", "n", "text", "job", "kvs", "message", "req", "apps"]),
            _json,
        ),
    ),
    st.builds(wire.output, st.integers(0, 6), st.sampled_from([wire.STDOUT, wire.STDERR]), st.binary(max_size=20)),
    st.binary(max_size=20),
)


@pytest.fixture(scope="module")
def remote_plan() -> Iterator:
    """A planned job of 2 ranks on each of two remote hosts (nothing is started)."""
    spec = parse_args(["-H", "hosta:2,hostb:2", "-n", "4", "--output-filename", os.devnull + ":nocopy", "true"])
    plan, _ = build_plan(spec, {"PATH": os.defpath}, ThisMachine())
    yield plan


@given(st.lists(_controller_frames, min_size=1, max_size=6))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzz_controller_survives_any_agent_frames(remote_plan, capsys: pytest.CaptureFixture[str], frames) -> None:
    """An agent's frames, sane or not, never crash the controller: a frame it cannot use (bad
    fields, or a process of another host) counts as a garbled link, which is closed."""
    sink = OutputSink(None, None, False)
    sink.add_job(1, list(range(4)))
    links = {0: FakeAgentLink(), 1: FakeAgentLink()}
    controller = Controller(remote_plan, sink, links)  # type: ignore[arg-type]
    try:
        host = controller.links[1]
        links[1].inbox.append(b"".join(frames))
        while host.open:
            controller.read_link(host, time.monotonic())
            if not links[1].inbox and host.open:
                break
    finally:
        for link in links.values():
            link.close()
        controller.sel.close()
    err = capsys.readouterr().err
    assert "Traceback" not in err


def test_controller_refuses_a_process_of_another_host(remote_plan, capsys: pytest.CaptureFixture[str]) -> None:
    """hostb's agent speaks of rank 0, which runs on hosta: the link is garbled, rank 0 untouched."""
    sink = OutputSink(None, None, False)
    sink.add_job(1, list(range(4)))
    links = {0: FakeAgentLink(), 1: FakeAgentLink()}
    controller = Controller(remote_plan, sink, links)  # type: ignore[arg-type]
    try:
        host_b: HostLink = controller.links[1]
        links[1].inbox.append(wire.control("exited", proc=0, status=3, pmi="new"))
        controller.read_link(host_b, time.monotonic())
        assert not host_b.open and not controller.procs[0].done
        assert "garbled message from the agent of hostb" in capsys.readouterr().err
    finally:
        for link in links.values():
            link.close()
        controller.sel.close()


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
    proc = launcher.run("--ssh-config", str(config), "-H", "mute:1", "-n", "1", "true")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert words in err and "Traceback" not in err
    assert listener.accepted == 0


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
