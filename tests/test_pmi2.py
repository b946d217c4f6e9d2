"""PMI-2: the frame format (pure functions, fuzzed) and the server, driven by real rank processes.

The ranks are `tests/ranks/pmi2_raw.py`, a PMI-2 client written for these tests, and not
MPICH itself: the `mpich` wheel (5.0.2) that mpi4py loads is built without PMI-2. With
`MPIR_CVAR_PMI_VERSION=2` its `MPI_Init` fails in `MPIR_pmi_init` (line 225, the check of
that variable, which returns an internal error when MPICH was configured without
ENABLE_PMI2) before a byte reaches PMI_FD, under hydra's `mpiexec` as under mpilaunch;
`MPIR_CVAR_PMI_VERSION=x` (PMIx) fails the same way and `PMI_VERSION=2` still sends
`cmd=init pmi_version=1`. The library holds the generic PMI-2 wire client (`fullinit`,
`PMI2_Init` strings) but not MPICH's PMI-2 glue (`mpir_pmi2.inc`: its strings
`universeSize` and `can't parse universe size` are absent). Debian's MPICH 4.0.2 is PMI-1
only too. `test_real_mpich_pmi2_client` runs mpi4py under `--mpi pmi2` anyway and is skipped
with that reason while the wheel cannot do it.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpilaunch.agent.services import pmi2
from mpilaunch.agent.services.pmi1 import ProtocolError
from mpilaunch.protocol.messages import PmiJob, encode

from .conftest import ROOT, Launcher, tagged_pids, write_script

PY = sys.executable
RAW2 = str(ROOT / "tests" / "ranks" / "pmi2_raw.py")


# -- the frame format --------------------------------------------------------------------------
def test_frames_by_example() -> None:
    frame = pmi2.format_frame("kvs-put", [("thrid", "0x1"), ("key", "a"), ("value", "x;y")])
    assert frame == b"    39cmd=kvs-put;thrid=0x1;key=a;value=x;;y;"
    body, used = pmi2.split_frame(frame + b"more")
    assert used == len(frame)
    assert pmi2.parse_body(body) == [("cmd", "kvs-put"), ("thrid", "0x1"), ("key", "a"), ("value", "x;y")]
    assert pmi2.split_frame(frame[:-1]) is None and pmi2.split_frame(b"   ") is None
    # MPICH 3's client left-aligns the length; the last `;` may be missing; values may be empty.
    assert pmi2.parse_body(pmi2.split_frame(b"19    cmd=finalize;thrid=")[0]) == [("cmd", "finalize"), ("thrid", "")]
    assert pmi2.response("kvs-get", "7", 0, [("found", "TRUE"), ("value", ";")]) == (
        b"    54cmd=kvs-get-response;thrid=7;rc=0;found=TRUE;value=;;;"
    )
    assert pmi2.response("finalize", None) == b"    27cmd=finalize-response;rc=0;"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"12ab56cmd=x;", "bad PMI-2 length prefix"),
        (b"-00001cmd=x;", "bad PMI-2 length prefix"),
        (b"999999", "a PMI-2 frame of 999999 bytes"),
        (b"     0", "without cmd="),
        (b"     5cmd=;", "without cmd="),
        (b"     6key=a;", "without cmd="),
        (b"    10cmd=x;oops", "field without '='"),
        (b"    10cmd=x;=abc", "bad PMI-2 key"),
        (b"     6cmd=\xe9;", "not ASCII"),
    ],
)
def test_malformed_frames_are_refused(data: bytes, words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        got = pmi2.split_frame(data)
        assert got is not None
        pmi2.parse_body(got[0])


def test_spawn_request_with_two_programs() -> None:
    pairs = pmi2.parse_body(
        b"cmd=spawn;thrid=1;ncmds=2;preputcount=1;ppkey0=k;ppval0=v;"
        b"subcmd=/bin/a;maxprocs=2;argc=2;argv0=x;argv1=y;infokeycount=1;infokey0=wdir;infoval0=/tmp;"
        b"subcmd=/bin/b;maxprocs=1;argc=0;"
    )
    assert pmi2.spawn_apps(pairs) == [
        {"nprocs": 2, "argv": ["/bin/a", "x", "y"], "preput": {"k": "v"}, "info": {"wdir": "/tmp"}, "wdir": "/tmp"},
        {"nprocs": 1, "argv": ["/bin/b"], "preput": {}, "info": {}},
    ]
    for bad in (b"cmd=spawn;ncmds=2;subcmd=a;maxprocs=1;", b"cmd=spawn;subcmd=a;maxprocs=0;", b"cmd=spawn;subcmd=a;"):
        with pytest.raises((KeyError, ValueError)):
            pmi2.spawn_apps(pmi2.parse_body(bad))


KEYS = st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True)
VALUES = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


@given(
    cmd=st.from_regex(r"[a-z-]{1,20}", fullmatch=True),
    pairs=st.lists(st.tuples(KEYS, VALUES), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
)
@settings(max_examples=400, deadline=None)
def test_fuzz_round_trip_in_any_chunking(cmd: str, pairs: list[tuple[str, str]], cuts: list[int]) -> None:
    """format -> bytes cut anywhere -> split_frame/parse_body gives back the same fields, twice."""
    stream = pmi2.format_frame(cmd, pairs) * 2
    bounds = [0, *sorted({min(cut, len(stream)) for cut in cuts}), len(stream)]
    buf, out = bytearray(), []
    for start, end in zip(bounds, bounds[1:]):
        buf += stream[start:end]
        while (got := pmi2.split_frame(buf)) is not None:
            del buf[: got[1]]
            out.append(pmi2.parse_body(got[0]))
    assert out == [[("cmd", cmd), *pairs]] * 2 and not buf


@given(st.binary(max_size=300))
@settings(max_examples=1000, deadline=None)
def test_fuzz_parser_only_raises_protocol_error(data: bytes) -> None:
    for candidate in (data, b"%6d" % len(data) + data, b"%6d" % max(0, len(data) - 6) + data):
        try:
            got = pmi2.split_frame(candidate)
            if got is not None:
                pairs = pmi2.parse_body(got[0])
                assert pairs[0][0] == "cmd" and pairs[0][1]
                if pairs[0][1] == "spawn":
                    pmi2.spawn_apps(pairs)
        except ProtocolError:
            pass
        except (KeyError, ValueError) as exc:  # spawn_apps' refusal, answered rc=-1 by the server
            assert not isinstance(exc, UnicodeError)


# -- the server in this process, fuzzed --------------------------------------------------------
JOB = PmiJob(job=1, size=2, universe=2, kvsname="kvs_t_1", mapping="(vector,(0,1,2))", preput={})
FIELD_KEYS = ["key", "value", "wait", "name", "port", "jobid", "exitcode", "message", "thrid", "ncmds", "subcmd"]
FIELD_KEYS += ["maxprocs", "argc", "argv0", "preputcount", "ppkey0", "ppval0", "infokeycount", "pmirank", "srcid"]
COMMANDS = ["fullinit", "job-getid", "kvs-put", "kvs-get", "kvs-fence", "info-putnodeattr", "info-getnodeattr"]
COMMANDS += ["info-getjobattr", "finalize", "abort", "name-publish", "name-lookup", "spawn", "job-connect", "bogus"]
FIELD_VALUES = st.sampled_from(["", "0", "1", "-1", "--5", "TRUE", "x;y", "9" * 30])
REQUESTS = st.builds(
    pmi2.format_frame,
    st.sampled_from(COMMANDS),
    st.lists(st.tuples(st.sampled_from(FIELD_KEYS), FIELD_VALUES), max_size=8),
)


V1_COMMANDS = ["init", "get_maxes", "put", "get", "barrier_in", "abort", "publish_name", "lookup_name", "spawn"]
V1_KEYS = ["kvsname", "key", "value", "exitcode", "service", "port", "pmi_version", "nprocs", "execname", "totspawns"]
V1_LINES = st.builds(
    lambda cmd, pairs: (f"cmd={cmd} " + " ".join(f"{k}={v}" for k, v in pairs) + "\n").encode(),
    st.sampled_from(V1_COMMANDS),
    st.lists(st.tuples(st.sampled_from(V1_KEYS), st.sampled_from(["", "1", "--5", "2", "kvs_t_1", "a b"])), max_size=5),
)


@given(
    st.lists(st.one_of(REQUESTS, V1_LINES, st.sampled_from([b"endcmd\n"]), st.binary(max_size=80)), max_size=8),
    st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_fuzz_server_answers_or_refuses_but_never_raises(messages: list[bytes], init_line: bool) -> None:
    """Whatever a rank sends, the job's PMI server answers it or reports the rank (pmi_error); it never raises."""
    from mpilaunch.agent.services.pmi_server import JobServer
    from mpilaunch.protocol import wire

    sent: list[bytes] = []
    service = JobServer(JOB, lambda message: sent.append(encode(message)))
    ours, theirs = service.attach(0, 0, 0)
    theirs.setblocking(False)
    try:
        for data in [b"cmd=init pmi_version=2 pmi_subversion=0\n"] * init_line + messages:
            theirs.sendall(data)
            alive = service.readable(ours.fileno())
            try:
                while theirs.recv(1 << 16):
                    pass
            except BlockingIOError:
                pass
            if not alive:
                errors = [f for f in wire.Decoder().feed(b"".join(sent)) if f[1]["op"] == "pmi_error"]
                assert errors and errors[-1][1]["error"].startswith("PMI protocol error: ")
                break
    finally:
        ours.close()
        theirs.close()


# -- the server, with real ranks ---------------------------------------------------------------
@pytest.mark.parametrize("mpi", ["pmi1", "pmi2"])
def test_a_pmi2_session_against_the_server(launcher: Launcher, mpi: str) -> None:
    proc = launcher.run("--mpi", mpi, "-n", "2", PY, RAW2, "session", timeout=60)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, err + out
    assert "rank 0 ok" in out and "rank 1 ok" in out
    assert "0< cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0" in out
    assert re.search(r"1< cmd=fullinit-response;rc=0;pmi-version=2;pmi-subversion=0;rank=1;size=2;appnum=0;", out)
    assert "1< cmd=info-getnodeattr-response;thrid=0x1011;rc=0;found=TRUE;value=seg;;0;" in out
    assert err.strip() == "mpilaunch: rank 1 sent unknown PMI-2 command 'frobnicate'"


def test_pmi1_and_pmi2_ranks_share_one_barrier(launcher: Launcher) -> None:
    proc = launcher.run("-n", "2", PY, RAW2, "mixed", timeout=60)
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode() + out
    assert "0< cmd=barrier_out rc=0" in out and "1< cmd=kvs-fence-response;thrid=0x1003;rc=0;" in out
    assert "rank 0 ok" in out and "rank 1 ok" in out


def test_a_client_may_start_with_a_frame_instead_of_the_init_line(launcher: Launcher) -> None:
    proc = launcher.run("-n", "2", PY, RAW2, "frame_first", timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().count(" ok") == 2


def test_pmi2_spawn(launcher: Launcher) -> None:
    proc = launcher.run("--oversubscribe", "-n", "1", PY, RAW2, "spawn", timeout=60)
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode() + out
    jobid = re.search(r"parent jobid=(\S+)", out).group(1)  # type: ignore[union-attr]
    assert "0< cmd=spawn-response;thrid=0x0003;rc=0;" in out
    for r in range(2):
        assert f"child {r} of 2: spawner-jobid={jobid} greeting=hello;world" in out
    assert not tagged_pids(launcher.tag)


def test_pmi2_abort_ends_the_job_with_its_code(launcher: Launcher) -> None:
    start = time.monotonic()
    proc = launcher.run("-n", "2", PY, RAW2, "abort", timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 7, err
    assert time.monotonic() - start < 10
    assert "mpilaunch: rank 1 called MPI_Abort with code 7: boom;bang" in err and "Rank:      1" in err


@pytest.mark.parametrize(
    ("scenario", "words"),
    [
        ("bad_length", "PMI protocol error: bad PMI-2 length prefix b'12ab56'"),
        ("too_long", "PMI protocol error: a PMI-2 frame of 999999 bytes (the limit is 65536)"),
        ("no_cmd", "PMI protocol error: PMI-2 frame without cmd="),
        ("no_equals", "PMI protocol error: PMI-2 field without '=': 'novalue'"),
        ("bad_key", "PMI protocol error: bad PMI-2 key 'k y'"),
        ("not_ascii", "PMI protocol error: PMI-2 frame is not ASCII"),
        ("garbage", "PMI protocol error: bad PMI-2 length prefix b'\\xff\\xfe thi'"),
        ("mid_frame", "closed its PMI connection before finalize"),
    ],
)
def test_hostile_pmi2_clients_abort_the_job_naming_the_rank(launcher: Launcher, scenario: str, words: str) -> None:
    """Rank 1 breaks the protocol while rank 0 waits: one line names it, the job ends at once."""
    start = time.monotonic()
    proc = launcher.run("-n", "2", PY, RAW2, scenario, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert time.monotonic() - start < 10
    assert err.splitlines()[0] == f"mpilaunch: rank 1 {words}"
    assert "Rank:      1" in err and "Traceback" not in err


TCP_PMI2 = """
import os, socket
host, port = os.environ["PMI_PORT"].split(":")
sock = socket.create_connection((host, int(port)))
reader = sock.makefile("rb")
sock.sendall(f"cmd=initack pmiid={os.environ['PMI_ID']}\\n".encode())
for _ in range(4):
    reader.readline()
sock.sendall(b"cmd=init pmi_version=2 pmi_subversion=0\\n")
print(reader.readline().decode().strip())
for body in (b"cmd=fullinit;pmirank=0;", b"cmd=finalize;"):
    sock.sendall(b"%6d" % len(body) + body)
    print(reader.read(int(reader.read(6))).decode())
"""


def test_pmi2_over_tcp_after_the_initack_line(launcher: Launcher, tmp_path: Path) -> None:
    """--pmi-tcp serves a PMI-2 client that presents its PMI_ID first (MPICH's own does not)."""
    script = write_script(tmp_path, "tcp2.py", TCP_PMI2)
    proc = launcher.run("--pmi-tcp", "-n", "1", PY, script, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().splitlines() == [
        "cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0",
        "cmd=fullinit-response;rc=0;pmi-version=2;pmi-subversion=0;rank=0;size=1;appnum=0;debugged=FALSE;pmiverbose=FALSE;",
        "cmd=finalize-response;rc=0;",
    ]


def test_a_rank_that_never_reads_its_replies_cannot_stall_the_agent(launcher: Launcher) -> None:
    """Rank 1 floods requests without reading: after 5 s of a full socket the agent reports it."""
    start = time.monotonic()
    proc = launcher.run("-n", "2", PY, RAW2, "flood", timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert time.monotonic() - start < 20
    assert err.splitlines()[0] == "mpilaunch: rank 1 did not read its PMI replies for 5 s"
    assert "Traceback" not in err


def test_mpi_pmi2_tells_mpich_unless_the_user_did(launcher: Launcher) -> None:
    def variables(*args: str, env: dict | None = None) -> list[str]:
        proc = launcher.run("--dry-run", *args, "-n", "1", "true", env=env)
        assert proc.returncode == 0, proc.stderr
        return [line.strip() for line in proc.stdout.decode().splitlines() if "PMI_VERSION" in line]

    assert variables("--mpi", "pmi2") == ["MPIR_CVAR_PMI_VERSION=2"]
    assert variables() == [] and variables("--mpi", "none") == []
    assert variables("--mpi", "pmi2", "-x", "MPIR_CVAR_PMI_VERSION=1") == ["MPIR_CVAR_PMI_VERSION=1"]
    assert variables("--mpi", "pmi2", env={"MPICH_PMI_VERSION": "1"}) == []  # inherited by the ranks as it is
    proc = launcher.run("--mpi", "pmi2", "--pmi-tcp", "-n", "1", "true")
    assert proc.returncode == 2 and b"--mpi pmi2 with --pmi-tcp" in proc.stderr


def test_real_mpich_pmi2_client(launcher: Launcher, tmp_path: Path) -> None:
    """mpi4py under --mpi pmi2; skipped while the installed MPICH has no PMI-2 (see the module docstring)."""
    pytest.importorskip("mpi4py")
    script = write_script(
        tmp_path,
        "coll.py",
        "from mpi4py import MPI\nc = MPI.COMM_WORLD\nprint('sum', c.allreduce(c.Get_rank() + 1), c.Get_size())\n",
    )
    proc = launcher.run("--mpi", "pmi2", "--oversubscribe", "-n", "3", PY, script, timeout=120)
    if proc.returncode != 0 and b"MPIR_pmi_init" in proc.stderr:
        pytest.skip("the installed MPICH was built without PMI-2: MPI_Init fails in MPIR_pmi_init")
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode().splitlines() == ["sum 6 3"] * 3
