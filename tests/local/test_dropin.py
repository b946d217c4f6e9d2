"""mpilaunch under other launchers' names and with their words (issue "Drop-in where the tools
look"): `mpilaunch shims DIR`, what each name says of itself, Open MPI's and hydra's less common
options with their meaning (checked against the real mpirun.openmpi where it runs here), root and
small machines without flags, and one line with status 2 for every bad value."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Launcher

PY = sys.executable
MPIRUN = shutil.which("mpirun.openmpi") or ""
NAMES = ("mpirun", "mpiexec", "orterun", "mpiexec.hydra", "ompi_info", "torchrun")


def one_line(err: bytes) -> str:
    text = err.decode()
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text[:2000]
    return lines[0]


@pytest.fixture
def shims(launcher: Launcher, tmp_path: Path) -> Path:
    proc = launcher.run("shims", str(tmp_path / "bin"))
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode() == f"{tmp_path / 'bin'}\n"
    return tmp_path / "bin"


def shim_run(
    launcher: Launcher, shims: Path, name: str, *args: str, rest: str | None = None
) -> subprocess.CompletedProcess:
    """NAME found first on PATH, as a tool finds it (rest: the PATH after the shims)."""
    env = {**launcher.env, "PATH": f"{shims}{os.pathsep}{launcher.env['PATH'] if rest is None else rest}"}
    return subprocess.run(
        [name, *args], capture_output=True, env=env, timeout=60, cwd=launcher.tmp_path, stdin=subprocess.DEVNULL
    )


# ---- names ---------------------------------------------------------------------------------------


def test_shims_writes_every_name_and_nothing_is_on_path_by_installing(shims: Path) -> None:
    assert sorted(p.name for p in shims.iterdir()) == sorted(NAMES)
    for name in NAMES:
        path = shims / name
        assert os.access(path, os.X_OK)
        assert path.read_text().startswith(f"#!{PY}\n")
    from importlib.metadata import distribution

    scripts = [e.name for e in distribution("mpilaunch").entry_points if e.group == "console_scripts"]
    assert scripts == ["mpilaunch"]


def test_shims_again_replaces_its_own_and_never_another_file(launcher: Launcher, shims: Path) -> None:
    again = launcher.run("shims", str(shims))
    assert again.returncode == 0, again.stderr.decode()
    (shims / "mpirun").write_text("#!/bin/sh\necho the real one\n")
    proc = launcher.run("shims", str(shims))
    assert proc.returncode == 2
    assert (
        one_line(proc.stderr)
        == f"mpilaunch: shims: {shims / 'mpirun'} exists and is not an mpilaunch shim; it is left as it is"
    )
    assert (shims / "mpirun").read_text() == "#!/bin/sh\necho the real one\n"
    assert not [p for p in shims.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("args", [[], ["a", "b"], ["--bogus"]])
def test_shims_usage_is_one_line(launcher: Launcher, args: list[str]) -> None:
    proc = launcher.run("shims", *args)
    assert proc.returncode == 2 and one_line(proc.stderr).startswith("mpilaunch: usage: mpilaunch shims DIR")


def test_each_name_says_what_it_is(launcher: Launcher, shims: Path) -> None:
    first = {name: shim_run(launcher, shims, name, "--version").stdout.decode().splitlines()[0] for name in NAMES[:4]}
    assert first["mpirun"] == "mpirun (Open MPI) 4.1: mpilaunch 0.1.0, reading Open MPI 4.1's mpirun command line"
    assert first["orterun"].startswith("orterun (Open MPI) 4.1: mpilaunch 0.1.0")
    assert "Open MPI" in first["mpiexec"] and "MPICH hydra's mpiexec" in first["mpiexec"]
    assert first["mpiexec.hydra"].startswith("HYDRA build details: mpiexec.hydra is mpilaunch 0.1.0")
    assert "MPICH" in first["mpiexec.hydra"] and "Open MPI" not in first["mpiexec.hydra"]
    info = shim_run(launcher, shims, "ompi_info", rest="")  # no Open MPI of its own on PATH
    assert info.returncode == 0 and b"Package: mpilaunch 0.1.0 (a launcher, not an MPI library)" in info.stdout
    version = shim_run(launcher, shims, "ompi_info", "--version", rest="")
    assert version.stdout.decode().startswith("Open MPI v4.1 (command line): mpilaunch 0.1.0, not an MPI library")
    plain = launcher.run("--version")
    assert plain.stdout == b"mpilaunch 0.1.0\n"
    torchrun = shim_run(launcher, shims, "torchrun", "--version")
    assert (torchrun.returncode, torchrun.stdout) == (0, b"mpilaunch 0.1.0\n")  # it is no Open MPI


@pytest.mark.skipif(not shutil.which("ompi_info"), reason="needs Open MPI's own ompi_info")
def test_ompi_info_is_open_mpis_own_when_one_is_on_path(launcher: Launcher, shims: Path) -> None:
    """What tools read from it (`mpi_built_with_cuda_support`, ...) is the ranks' library's: its
    every line, in order. A value may differ between two runs of Open MPI's own (a `true` for a
    `false` among the `mca:` lines, once, while other tests loaded the machine), so lines are
    compared up to their last field, and in full where tools read them."""
    proc = shim_run(launcher, shims, "ompi_info", "--parsable", "--all")
    real = shim_run(launcher, shims.parent, "ompi_info", "--parsable", "--all")  # no shim before it
    assert proc.returncode == 0 and real.returncode == 0

    def read_by_tools(out: bytes) -> list[bytes]:
        return [line for line in out.splitlines() if not line.startswith(b"mca:") or b"cuda" in line]

    assert [line.rpartition(b":")[0] for line in proc.stdout.splitlines()] == [
        line.rpartition(b":")[0] for line in real.stdout.splitlines()
    ]
    assert read_by_tools(proc.stdout) == read_by_tools(real.stdout)
    assert b"mpi_built_with_cuda_support:value:" in proc.stdout


def test_ambiguous_words_take_the_meaning_of_the_name(launcher: Launcher, shims: Path) -> None:
    """-host a:2 gives a two slots under mpirun (Open MPI), and under mpiexec.hydra is hydra's
    list, whose counts are blocks placed round-robin with no limit."""
    ompi = shim_run(launcher, shims, "mpirun", "--dry-run", "-print-rank-map", "-host", "a:2,b:2", "-n", "4", "true")
    hydra = shim_run(
        launcher, shims, "mpiexec.hydra", "--dry-run", "-print-rank-map", "-host", "a:1,b", "-n", "3", "true"
    )
    assert ompi.returncode == 0 and hydra.returncode == 0, (ompi.stderr, hydra.stderr)
    assert ompi.stdout.startswith(b"(a:0,1)\n(b:2,3)\n")
    assert hydra.stdout.startswith(b"(a:0,2)\n(b:1)\n")
    refused = shim_run(launcher, shims, "mpirun", "-host", "a:1", "-n", "2", "true")
    assert refused.returncode == 2 and b"not enough slots" in refused.stderr


def test_two_dash_host_words_and_mpiexecs_host_words_are_hydras(launcher: Launcher, shims: Path) -> None:
    """hydra reads --host, --hostfile and --machinefile as -hosts and -f; under mpiexec a line with
    no word only Open MPI has reads -host and -hostfile as hydra's too (it runs what Open MPI
    refuses); mpirun keeps Open MPI's meaning."""
    (launcher.tmp_path / "hf").write_text("localhost\n")
    (launcher.tmp_path / "nodes").write_text("a\nb\n")
    shown = ["--dry-run", "-print-rank-map"]
    for name, args, placed in (
        ("mpiexec", ["-ppn", "2", "--host", "a,b", "-n", "4"], b"(a:0,1)\n(b:2,3)\n"),
        ("mpiexec.hydra", ["--hostfile", "nodes", "-n", "3"], b"(a:0,2)\n(b:1)\n"),
        ("mpiexec.hydra", ["--machinefile=nodes", "-ppn", "2", "-n", "3"], b"(a:0,1)\n(b:2)\n"),
        ("mpilaunch", ["-genv", "A=1", "--host", "a", "-n", "2"], b"(a:0,1)\n"),
    ):
        proc = (
            shim_run(launcher, shims, name, *shown, *args, "true")
            if name != "mpilaunch"
            else launcher.run(*shown, *args, "true")
        )
        assert proc.returncode == 0 and proc.stdout.startswith(placed), (args, proc.stdout, proc.stderr)
    for args in (["-host", "localhost", "-n", "2"], ["-hostfile", "hf", "-n", "4"]):
        ran = shim_run(launcher, shims, "mpiexec", *args, "sh", "-c", "echo $PMI_RANK")
        assert ran.returncode == 0 and len(ran.stdout.split()) == int(args[-1]), (args, ran.stderr)
    for name, args in (("mpirun", ["-host", "localhost"]), ("mpiexec", ["-x", "A=1", "-host", "localhost"])):
        refused = shim_run(launcher, shims, name, *args, "-n", "2", "true")
        assert refused.returncode == 2 and b"not enough slots" in refused.stderr, (name, args)


def test_a_job_through_each_name(launcher: Launcher, shims: Path) -> None:
    for name, args, rows in (
        ("mpirun", ["-n", "2", "-x", "A=1", "sh", "-c", "echo $OMPI_COMM_WORLD_RANK $A"], ["0 1", "1 1"]),
        ("orterun", ["-np", "2", "sh", "-c", "echo $OMPI_COMM_WORLD_RANK"], ["0", "1"]),
        ("mpiexec", ["-n", "2", "-genv", "A", "2", "sh", "-c", "echo $PMI_RANK $A"], ["0 2", "1 2"]),
        ("mpiexec.hydra", ["-hosts", "localhost", "-ppn", "3", "-genv", "A=3", "sh", "-c", "echo $PMI_RANK $A"],
         ["0 3", "1 3", "2 3"]),
    ):  # fmt: skip
        proc = shim_run(launcher, shims, name, *args)
        assert proc.returncode == 0, (name, proc.stderr.decode())
        assert sorted(proc.stdout.decode().splitlines()) == rows, name


def test_a_program_without_n_is_one_rank_in_hydras_words(launcher: Launcher, shims: Path) -> None:
    """hydra's host list, with no host given, is this machine once: one rank per program without
    -n (`mpiexec -n 1 ./master : ./worker`); Open MPI's line gives it the slots left."""
    rank = ["sh", "-c", "echo $PMI_RANK"]
    for name, args, ranks in (
        ("mpiexec.hydra", rank, ["0"]),
        ("mpiexec", ["-genv", "FOO", "1", *rank], ["0"]),
        ("mpiexec", ["-l", *rank], ["[0] 0"]),
        ("mpiexec", ["-genv", "A=1", "-n", "1", *rank, ":", *rank], ["0", "1"]),
        ("mpiexec.hydra", [*rank, ":", *rank], ["0", "1"]),
    ):
        proc = shim_run(launcher, shims, name, *args)
        assert proc.returncode == 0, (args, proc.stderr.decode())
        assert sorted(proc.stdout.decode().splitlines()) == ranks, args
    full = shim_run(launcher, shims, "mpirun", "-H", "localhost:2", "-n", "2", "true", ":", "true")
    assert full.returncode == 2 and one_line(full.stderr) == (
        "mpilaunch: program 2 (true) has no -n and the programs before it take every slot (2 in all); give it -n"
    )


# ---- root and small machines ---------------------------------------------------------------------


def test_more_ranks_than_cores_here_is_one_note_and_with_hosts_open_mpis_rule(launcher: Launcher) -> None:
    cores = os.cpu_count() or 1
    np = str(cores + 2)
    env = {k: v for k, v in launcher.env.items() if not k.startswith("OMPI_ALLOW")}
    proc = subprocess.run(
        launcher.argv("-n", np, "sh", "-c", "echo $OMPI_COMM_WORLD_RANK"), capture_output=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(map(int, proc.stdout.split())) == list(range(cores + 2))
    assert one_line(proc.stderr) == f"mpilaunch: {np} ranks on {cores} cores: they take turns"
    quiet = launcher.run("-q", "-n", np, "true")
    assert quiet.returncode == 0 and quiet.stderr == b""
    given = launcher.run("-H", f"localhost:{cores}", "-n", np, "true")
    assert given.returncode == 2 and "not enough slots" in one_line(given.stderr)


# ---- Open MPI's words, against the real mpirun -----------------------------------------------------

BINDINGS = [
    ["-n", "2", "--map-by", "socket:PE=1"],
    ["-n", "1", "--map-by", "ppr:1:node:PE=2"],
    ["-n", "2", "--map-by", "ppr:2:node:PE=1"],
    ["-n", "2", "--bind-to", "core"],
    ["-n", "2", "--bind-to", "numa"],
    ["-n", "2", "--bind-to", "socket"],
    ["-n", "2", "--use-hwthread-cpus", "--bind-to", "core"],
    ["-n", "2", "--bind-to", "hwthread"],
    ["-n", "1", "--cpus-per-proc", "2", "--bind-to", "core"],
]


def _bindings(stderr: bytes) -> list[str]:
    """The --report-bindings lines, without the process id (`[vm:1234] MCW rank 0 ...`)."""
    lines = [re.sub(r"^\[([^:\]]+):\d+\] ", r"[\1] ", line) for line in stderr.decode().splitlines()]
    return sorted(line for line in lines if " MCW rank " in line)


@pytest.mark.skipif(not MPIRUN, reason="Open MPI's mpirun.openmpi (Debian's openmpi-bin) is not installed")
@pytest.mark.parametrize("args", BINDINGS, ids=[" ".join(a) for a in BINDINGS])
def test_bindings_are_reported_as_mpirun_reports_them(launcher: Launcher, args: list[str]) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    theirs = subprocess.run(
        [MPIRUN, "--allow-run-as-root", "--report-bindings", *args, "true"], capture_output=True, timeout=60
    )
    ours = launcher.run("--report-bindings", *args, "true")
    assert ours.returncode == theirs.returncode == 0, (ours.stderr, theirs.stderr)
    assert _bindings(ours.stderr) == _bindings(theirs.stderr)
    assert _bindings(ours.stderr)


@pytest.mark.skipif(not MPIRUN, reason="Open MPI's mpirun.openmpi (Debian's openmpi-bin) is not installed")
def test_too_few_cores_for_pe_is_refused_as_mpirun_refuses_it(launcher: Launcher) -> None:
    cores = len(os.sched_getaffinity(0))
    args = ["-n", "2", "--map-by", f"socket:PE={cores}"]
    theirs = subprocess.run([MPIRUN, "--allow-run-as-root", *args, "true"], capture_output=True, timeout=60)
    ours = launcher.run(*args, "true")
    assert theirs.returncode != 0 and ours.returncode == 2
    assert f"2 ranks of {cores} cores each (PE={cores}) need {2 * cores} cores" in one_line(ours.stderr)


@pytest.mark.skipif(not MPIRUN, reason="Open MPI's mpirun.openmpi (Debian's openmpi-bin) is not installed")
def test_display_allocation_lists_what_mpirun_lists(launcher: Launcher, tmp_path: Path) -> None:
    (tmp_path / "hf").write_text("localhost slots=2 max_slots=3\n")
    theirs = subprocess.run(
        [MPIRUN, "--allow-run-as-root", "--hostfile", "hf", "--display-allocation", "-n", "1", "true"],
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
    )
    ours = launcher.run("--hostfile", "hf", "--display-allocation", "-n", "1", "true")
    assert theirs.returncode == ours.returncode == 0

    def rows(out: bytes) -> list[tuple[str, ...]]:
        found = re.findall(rb"\t(\S+): (?:flags=\S+ )?slots=(\d+) max_slots=(\d+) slots_inuse=(\d+)", out)
        return [tuple(x.decode() for x in row[1:]) for row in found]

    assert rows(ours.stdout) == rows(theirs.stdout) == [("2", "3", "0")]
    assert b"======================   ALLOCATED NODES   ======================" in ours.stdout


def test_am_and_tune_files_are_mca_parameters_and_exports(launcher: Launcher, tmp_path: Path) -> None:
    (tmp_path / "params.conf").write_text("# Open MPI's aggregate MCA file\nbtl = self,tcp\n\npml = ob1\n")
    (tmp_path / "tune.conf").write_text("-x TUNED=yes --mca btl_tcp_if_include lo\n")
    proc = launcher.run("--dry-run", "-am", "params.conf", "--tune", "tune.conf", "-n", "1", "true")
    assert proc.returncode == 0, proc.stderr.decode()
    shown = proc.stdout.decode()
    for line in ("OMPI_MCA_btl=self,tcp", "OMPI_MCA_pml=ob1", "TUNED=yes", "OMPI_MCA_btl_tcp_if_include=lo"):
        assert f"  {line}\n" in shown


def test_quiet_silences_notes_not_failures(launcher: Launcher, tmp_path: Path) -> None:
    loud = launcher.run("--output-filename", "logs", "-n", "1", "true", env={"OMP_NUM_THREADS": ""})
    quiet = launcher.run("-q", "--output-filename", "logs", "-n", "1", "true")
    assert b"mpilaunch: rank output goes to" in loud.stderr and quiet.stderr == b""
    failed = launcher.run("-q", "-n", "1", "sh", "-c", "exit 3")
    assert failed.returncode == 3 and b"exited with non-zero status" in failed.stderr
    assert launcher.run("-v", "-n", "1", "true").returncode == 0


# ---- hydra's words ---------------------------------------------------------------------------------

HYDRA = Path(PY).parent / "mpiexec.hydra"  # the mpich wheel's (the test extra)


@pytest.mark.skipif(not HYDRA.exists(), reason="MPICH's hydra (the mpich wheel of the test extra) is not installed")
def test_outfile_and_errfile_patterns_name_files_as_hydra_does(launcher: Launcher, tmp_path: Path) -> None:
    script = "echo out $PMI_RANK; echo err $PMI_RANK >&2"
    words = ["-outfile-pattern", "out.%r.%h.%g.%p", "-errfile-pattern", "err.%r", "-n", "3", "sh", "-c", script]
    for _ in range(3):  # hydra itself now and then dies of SIGPIPE on a loaded machine: its run is the reference
        shutil.rmtree(tmp_path / "hydra", ignore_errors=True)
        (tmp_path / "hydra").mkdir()
        theirs = subprocess.run([str(HYDRA), *words], capture_output=True, timeout=60, cwd=tmp_path / "hydra")
        if theirs.returncode != -signal.SIGPIPE:
            break
    assert theirs.returncode == 0, theirs
    ours = launcher.run(*words)
    assert ours.returncode == 0, ours.stderr.decode()
    host = os.uname().nodename
    made = sorted(p.name.replace(host, "HOST").replace("localhost", "HOST") for p in tmp_path.glob("*.*"))
    hydra_made = sorted(p.name.replace(host, "HOST") for p in (tmp_path / "hydra").iterdir())
    assert made == hydra_made
    assert ours.stdout == b""  # the files have it, not the console
    for rank in range(3):
        out = next(tmp_path.glob(f"out.{rank}.*"))
        assert out.read_text() == f"out {rank}\n" and (tmp_path / f"err.{rank}").read_text() == f"err {rank}\n"


def test_output_patterns_may_throw_the_output_away_and_no_other_device(launcher: Launcher) -> None:
    null = launcher.run("-outfile-pattern", "/dev/null", "-errfile-pattern", "/dev/null", "-n", "2", "sh", "-c",
                        "echo out; echo err >&2")  # fmt: skip
    assert null.returncode == 0 and null.stdout == b"" and b"err" not in null.stderr, null.stderr
    zero = launcher.run("-outfile-pattern", "/dev/zero", "-n", "1", "true")
    assert zero.returncode == 2 and "/dev/zero: a character device, not a regular file" in one_line(zero.stderr)


def test_hydra_words_with_their_meaning_or_a_note(launcher: Launcher) -> None:
    cuda = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    gpus = launcher.run("--dry-run", "-gpus-per-proc", "2", "-n", "2", "true", env=cuda)
    assert gpus.returncode == 0, gpus.stderr.decode()
    assert (
        "  CUDA_VISIBLE_DEVICES=4,5\n" in gpus.stdout.decode()
        and "  CUDA_VISIBLE_DEVICES=6,7\n" in gpus.stdout.decode()
    )
    bound = launcher.run("-binding", "cpu:cores", "--report-bindings", "-n", "2", "true")
    assert bound.returncode == 0 and bound.stderr.count(b"bound to socket 0[core ") == 2, bound.stderr
    fork = launcher.run("-bootstrap", "fork", "-H", "node1,node2", "-n", "2", "sh", "-c", "echo $PMI_RANK")
    assert fork.returncode == 0 and sorted(fork.stdout.split()) == [b"0", b"1"], fork.stderr
    for words, note in (
        (["-demux", "poll"], "mpilaunch: -demux poll: mpilaunch has one I/O loop of its own: ignored"),
        (["-rmk", "ll"], "mpilaunch: -rmk ll: mpilaunch does not read that resource manager's hosts: ignored"),
        (
            ["-bootstrap", "pbs"],
            "mpilaunch: -bootstrap pbs: mpilaunch starts agents over ssh (or srun in Slurm): read as auto",
        ),
        (
            ["-binding", "pin=yes"],
            "mpilaunch: -binding 'pin=yes' is not one mpilaunch reads (none, cpu:cores, cpu:sockets): ignored",
        ),
    ):
        proc = launcher.run(*words, "-n", "1", "true")
        assert proc.returncode == 0 and one_line(proc.stderr) == note, proc.stderr
    for words in (["-rmk", "user"], ["-rmk", "slurm"], ["-rmk", "sge"]):
        assert launcher.run(*words, "-n", "1", "true").stderr == b""


def test_hydras_other_words_are_read_or_said_to_mean_nothing(launcher: Launcher) -> None:
    """-n=2 and -usize as hydra reads them, -info as its version, and its flags that change
    nothing here accepted with one line each."""
    glued = launcher.run("-n=2", "sh", "-c", "echo $PMI_RANK")
    assert glued.returncode == 0 and sorted(glued.stdout.split()) == [b"0", b"1"], glued.stderr
    usize = launcher.run("-usize", "8", "-n", "1", "sh", "-c", "echo $OMPI_UNIVERSE_SIZE")
    assert usize.returncode == 0 and usize.stdout == b"8\n", usize.stderr
    info = launcher.run("-info")
    assert info.returncode == 0 and info.stdout.startswith(b"mpilaunch "), info.stderr
    for words, note in (
        (["-disable-x"], "-disable-x: no X forwarding here"),
        (["-disable-auto-cleanup"], "-disable-auto-cleanup: mpilaunch always ends the ranks of a failed job"),
        (["-print-all-exitcodes"], "-print-all-exitcodes: the summary names every rank that failed and its status"),
        (["-localhost", "here"], "-localhost here: the launcher's own host name is found here"),
        (["-order-nodes", "ASCENDING"], "-order-nodes ASCENDING: hosts are taken in the order given"),
        (["-envnone"], "-envnone: local ranks inherit the launcher's environment here"),
    ):
        proc = launcher.run(*words, "-n", "1", "true")
        assert proc.returncode == 0 and one_line(proc.stderr) == f"mpilaunch: {note}: ignored", proc.stderr


# ---- bad values ------------------------------------------------------------------------------------

BAD = [
    (["--rank-by", "bogus"], "--rank-by 'bogus': expected slot, node, core, socket, hwthread or numa"),
    (["-N", "0"], "-N"),
    (["-N", "x"], "-N"),
    (["--npersocket", "0"], "--npersocket"),
    (["--cpus-per-proc", "0"], "--cpus-per-proc"),
    (["--map-by", "ppr:x:node"], "--map-by 'ppr:x:node': expected ppr:N:node or ppr:N:socket"),
    (["--map-by", "slot:PE=0"], "--map-by 'slot:PE=0': PE= takes a number of cores from 1 to 4096"),
    (["--map-by", "slot:FOO"], "--map-by 'slot:FOO': unknown modifier 'FOO'"),
    (["--map-by", "bogus"], "--map-by 'bogus': expected slot, node, socket, core, numa, hwthread, ppr:N:node or"),
    (["-am", "missing.conf"], "missing.conf"),
    (["--tune", "missing.conf"], "missing.conf"),
    (["-ppn", "0"], "-ppn"),
    (["-hosts", ""], "-hosts '': empty host name"),
    (["-f", "missing-hosts"], "missing-hosts"),
    (["-gpus-per-proc", "0"], "-gpus-per-proc"),
    (["-bootstrap", "bogus"], "-bootstrap"),
    (["--bind-to", "l2cache"], "--bind-to 'l2cache': expected none, core, socket, numa or hwthread"),
    (["-outfile-pattern", "/nonexistent/dir/out.%r"], "-outfile-pattern /nonexistent/dir/out.%r: cannot write"),
    (["-mca", "plm_rsh_agent", "no-such-remote-shell"], "the remote shell 'no-such-remote-shell'"),
    (["-genv", "1BAD", "x"], "'1BAD' is not a variable name"),
    (["-genv"], "-genv"),
    (["-usize", "x"], "-usize 'x': expected a number of ranks"),
]


@pytest.mark.parametrize(("words", "said"), BAD, ids=[" ".join(w) or "empty" for w, _ in BAD])
def test_each_new_option_with_a_bad_value_is_one_line(launcher: Launcher, words: list[str], said: str) -> None:
    proc = launcher.run(*words, "-n", "1", "true")
    assert proc.returncode == 2, proc.stderr.decode()
    assert said in one_line(proc.stderr)


def test_tune_file_with_other_words_is_one_line(launcher: Launcher, tmp_path: Path) -> None:
    (tmp_path / "tune.conf").write_text("-x A=1 --bogus\n")
    proc = launcher.run("--tune", "tune.conf", "-n", "1", "true")
    assert proc.returncode == 2
    assert "a tune file holds -x NAME[=VALUE] and --mca KEY VALUE" in one_line(proc.stderr)
