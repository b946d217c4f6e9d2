"""hydra's failure and signal rules under hydra's names and words, side by side with MPICH's own
`mpiexec.hydra` (the mpich wheel's): a rank's plain exit ends only that rank, the status is the
ranks' exit codes ORed, a rank killed by a signal ends the job, and every SIGTERM is forwarded
(issue "Drop-in II"). Under Open MPI's words the first failure ends the job, as before."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Launcher, write_script

HYDRA = Path(sys.executable).parent / "mpiexec.hydra"  # the mpich wheel's (the test extra)
# Each rank sleeps its delay, prints, then exits with its code (a negative code: that signal).
EXITS = """\
import os, sys, time
r = int(os.environ["PMI_RANK"])
codes = [int(x) for x in sys.argv[1].split(",")]
delays = [float(x) for x in sys.argv[2].split(",")]
time.sleep(delays[r])
print(f"rank {r} leaving {codes[r]}", flush=True)
if codes[r] < 0:
    os.kill(os.getpid(), -codes[r])
sys.exit(codes[r])
"""
# Ranks that end on their own once signalled, after half a second of clean-up.
GRACEFUL = """\
import os, signal, sys, time
r = os.environ["PMI_RANK"]
got = []
for s in (signal.SIGTERM, signal.SIGINT):
    signal.signal(s, lambda n, f: got.append(signal.Signals(n).name))
print(f"ready {r}", flush=True)
while not got:
    time.sleep(0.02)
time.sleep(0.5)
print(f"rank {r} cleaned up after {len(got)}", flush=True)
"""


@pytest.fixture
def shims(launcher: Launcher, tmp_path: Path) -> Path:
    done = launcher.run("shims", str(tmp_path / "bin"))
    assert done.returncode == 0, done.stderr.decode()
    return tmp_path / "bin"


def run_as(launcher: Launcher, program: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run(
        [str(program), *args], capture_output=True, env=launcher.env, cwd=launcher.tmp_path, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return done, time.monotonic() - start


def peers(shims: Path) -> dict[str, Path]:
    if not HYDRA.exists():
        pytest.skip(f"needs MPICH's hydra ({HYDRA}): the test extra's mpich wheel")
    return {"mpilaunch": shims / "mpiexec.hydra", "hydra": HYDRA}


@pytest.mark.parametrize(
    "codes, delays, status",
    [("0,3,0", "2,0.2,1", 3), ("1,2,4", "0.1,0.2,0.3", 7), ("0,255", "1,0.1", 255)],
)
def test_a_ranks_exit_ends_only_that_rank_and_the_status_is_the_codes_ored(
    launcher: Launcher, tmp_path: Path, shims: Path, codes: str, delays: str, status: int
) -> None:
    """Rank 1 exits 3 while rank 0 still works for 2 s: rank 0 finishes and its lines are kept."""
    script = write_script(tmp_path, "exits.py", EXITS)
    for who, program in peers(shims).items():
        done, _took = run_as(launcher, program, "-n", str(codes.count(",") + 1), sys.executable, script, codes, delays)
        out = done.stdout.decode()
        assert done.returncode == status, (who, done.stderr.decode())
        for rank, code in enumerate(codes.split(",")):
            assert f"rank {rank} leaving {code}\n" in out, (who, out)


def test_a_rank_killed_by_a_signal_ends_the_job(launcher: Launcher, tmp_path: Path, shims: Path) -> None:
    """As hydra: the others are killed at once. The status is mpilaunch's 128 + the signal (hydra's
    is the signal numbers of every rank ORed, its own SIGKILLs among them: 9)."""
    script = write_script(tmp_path, "exits.py", EXITS)
    for who, program in peers(shims).items():
        done, took = run_as(launcher, program, "-n", "2", sys.executable, script, "0,-9", "10,0.2")
        assert done.returncode == (128 + 9 if who == "mpilaunch" else 9), (who, done.stderr.decode())
        assert took < 8 and b"rank 0 leaving" not in done.stdout, who


@pytest.mark.mpi
def test_an_mpich_rank_that_returns_3_after_finalize_keeps_rank_0s_output(
    launcher: Launcher, tmp_path: Path, shims: Path
) -> None:
    """The issue's case: rank 1 returns 3 after MPI_Finalize while rank 0 writes its results for
    2 s: every line of rank 0 is kept and the status is 3, as under hydra (it was 3 after 0.2 s,
    rank 0's output lost)."""
    pytest.importorskip("mpi4py")
    script = write_script(
        tmp_path, "late.py",
        "import sys, time\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.Get_rank()\nMPI.Finalize()\n"
        "if r == 1:\n    sys.exit(3)\nfor k in range(20):\n    time.sleep(0.1)\n    print('result', k, flush=True)\n",
    )  # fmt: skip
    for who, program in peers(shims).items():
        done, _took = run_as(launcher, program, "-n", "2", sys.executable, script)
        assert done.returncode == 3, (who, done.stderr.decode())
        assert done.stdout.decode().splitlines() == [f"result {k}" for k in range(20)], who


@pytest.mark.mpi
@pytest.mark.parametrize("words", [[], ["-usize", "5"], ["-hosts", "localhost:2"]])
def test_universe_size_and_pmi_hostname_are_hydras(
    launcher: Launcher, tmp_path: Path, shims: Path, words: list[str]
) -> None:
    """An MPICH rank's MPI_UNIVERSE_SIZE is unset unless -usize gives one (it was the slots), and
    PMI_HOSTNAME names its host as the host list does, as under hydra."""
    pytest.importorskip("mpi4py")
    script = write_script(
        tmp_path, "universe.py",
        "import os, sys\nfrom mpi4py import MPI\n"  # one write per line: hydra keeps no line whole
        "u, h = MPI.COMM_WORLD.Get_attr(MPI.UNIVERSE_SIZE), os.environ.get('PMI_HOSTNAME') is not None\n"
        "sys.stdout.write(f'{u} {h}\\n')\nsys.stdout.flush()\n",
    )  # fmt: skip
    seen = {}
    for who, program in peers(shims).items():
        done, _took = run_as(launcher, program, *words, "-n", "2", sys.executable, script)
        assert done.returncode == 0, (who, done.stderr.decode())
        seen[who] = sorted(done.stdout.decode().splitlines())
    assert seen["mpilaunch"] == seen["hydra"] == [f"{'5' if '-usize' in words else 'None'} True"] * 2
    if "-hosts" in words:
        shown = run_as(launcher, shims / "mpiexec.hydra", *words, "-n", "1", "sh", "-c", "echo $PMI_HOSTNAME")[0]
        assert shown.stdout == b"localhost\n"


@pytest.mark.mpi
def test_a_rank_that_leaves_mpi_unfinished_ends_the_job(launcher: Launcher, tmp_path: Path, shims: Path) -> None:
    """A rank that exits 3 between MPI_Init and MPI_Finalize ends the job, as under hydra."""
    pytest.importorskip("mpi4py")
    script = write_script(
        tmp_path, "unfinished.py",
        "import os, time\nfrom mpi4py import MPI\nif MPI.COMM_WORLD.Get_rank() == 1:\n    os._exit(3)\n"
        "time.sleep(10)\nprint('rank 0 done', flush=True)\n",
    )  # fmt: skip
    for who, program in peers(shims).items():
        done, took = run_as(launcher, program, "-n", "2", sys.executable, script)
        assert done.returncode == 3 and took < 8 and b"rank 0 done" not in done.stdout, (who, done.stderr.decode())


def test_under_open_mpis_words_the_first_failure_still_ends_the_job(
    launcher: Launcher, tmp_path: Path, shims: Path
) -> None:
    script = write_script(tmp_path, "exits.py", EXITS.replace('"PMI_RANK"', '"OMPI_COMM_WORLD_RANK"'))
    done, took = run_as(launcher, shims / "mpirun", "-n", "2", sys.executable, script, "0,3", "10,0.2")
    assert done.returncode == 3 and took < 8 and b"rank 0 leaving" not in done.stdout, done.stderr.decode()


@pytest.mark.parametrize("name", ["mpiexec", "mpiexec.hydra"])
def test_two_sigterms_reach_a_graceful_job_which_ends_itself(
    launcher: Launcher, tmp_path: Path, shims: Path, name: str
) -> None:
    """A tool stopping its MPI workers sends mpiexec two SIGTERMs 0.1 s apart: both go to the
    ranks, which clean up and exit 0, and so does the launcher, as under hydra."""
    script = write_script(tmp_path, "graceful.py", GRACEFUL)
    runs = {"mpilaunch": shims / name, "hydra": peers(shims)["hydra"]}
    for who, program in runs.items():
        proc = subprocess.Popen(
            [str(program), "-n", "2", sys.executable, script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=launcher.env, cwd=launcher.tmp_path, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert proc.stdout is not None
        ready = b""
        while ready.count(b"ready") < 2:  # hydra may join two ranks' lines in one ("ready 1ready 0")
            line = proc.stdout.readline()
            assert line, (who, ready)
            ready += line
        assert who == "hydra" or ready.splitlines() in ([b"ready 0", b"ready 1"], [b"ready 1", b"ready 0"]), ready
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, (who, err.decode())
        said = (
            out.decode().splitlines()
            if who == "mpilaunch"
            else re.findall(r"rank \d cleaned up after \d", out.decode())
        )
        assert sorted(said) == ["rank 0 cleaned up after 2", "rank 1 cleaned up after 2"], (who, out)


def test_under_open_mpis_words_a_second_sigterm_kills(launcher: Launcher, tmp_path: Path, shims: Path) -> None:
    script = write_script(tmp_path, "graceful.py", GRACEFUL.replace('"PMI_RANK"', '"OMPI_COMM_WORLD_RANK"'))
    proc = launcher.popen("-n", "2", sys.executable, script)
    assert proc.stdout is not None
    assert all(proc.stdout.readline().startswith(b"ready") for _ in range(2))
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and b"SIGTERM again: killing every rank" in err, err.decode()
    assert b"cleaned up" not in out
