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

from tests.conftest import ROOT, Launcher, tagged_pids, write_script

PY = sys.executable
RAW2 = str(ROOT / "tests" / "ranks" / "pmi2_raw.py")


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
