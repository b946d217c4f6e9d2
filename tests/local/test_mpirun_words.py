"""Open MPI's mpirun words that steer a job, as mpirun reads them (checked against the real
mpirun.openmpi where it runs here): the MCA parameters that set its own options, `-x` and `-H`
given after a ' : ' for that program alone, and Open MPI's older spellings."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import Launcher

MPIRUN = shutil.which("mpirun.openmpi") or ""
DEBIAN_PYTHON = "/usr/bin/python3"  # Debian's python3-mpi4py, built with Debian's Open MPI


def real_mpirun(launcher: Launcher, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MPIRUN, *args], capture_output=True, timeout=60, env={**launcher.env, **(env or {})}, cwd=launcher.tmp_path
    )


def lines(proc: subprocess.CompletedProcess) -> list[str]:
    return sorted(proc.stdout.decode().split())


# ---- MCA parameters that steer mpirun ----------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "ran"),
    [
        ({"env": {"OMPI_MCA_rmaps_base_oversubscribe": "yes"}}, True),
        ({"args": ("--mca", "rmaps_base_oversubscribe", "1")}, True),
        ({"args": ("--map-by", ":OVERSUBSCRIBE")}, True),
        ({"env": {"OMPI_MCA_rmaps_base_oversubscribe": "no"}}, False),
        ({"env": {"OMPI_MCA_rmaps_base_oversubscribe": "1"}, "args": ("--nooversubscribe",)}, False),
    ],
    ids=["env yes", "-mca 1", "map-by modifier alone", "env no", "the command line wins"],
)
def test_oversubscribing_as_a_ci_asks_mpirun_for_it(launcher: Launcher, how: dict, ran: bool) -> None:
    """`OMPI_MCA_rmaps_base_oversubscribe=yes mpirun -np 3 -H localhost:2`: CI's way to run
    more ranks than a small runner has slots."""
    args = (*how.get("args", ()), "-np", "3", "-H", "localhost:2", "sh", "-c", "echo r$OMPI_COMM_WORLD_RANK")
    proc = launcher.run("-q", *args, env=how.get("env"))
    if ran:
        assert proc.returncode == 0, proc.stderr.decode()
        assert lines(proc) == ["r0", "r1", "r2"]
    else:
        assert proc.returncode == 2 and b"not enough slots" in proc.stderr, proc.stderr.decode()
    if MPIRUN:
        real = real_mpirun(launcher, *args, env=how.get("env"))
        assert (real.returncode == 0) == ran, real.stderr.decode()[-500:]


def test_a_bad_mca_boolean_is_one_line(launcher: Launcher) -> None:
    proc = launcher.run("-np", "1", "true", env={"OMPI_MCA_rmaps_base_oversubscribe": "maybe"})
    assert proc.returncode == 2
    assert proc.stderr.decode() == (
        "mpilaunch: MCA parameter rmaps_base_oversubscribe='maybe': expected 1 or 0, true or false, yes or no\n"
    )


def test_tag_output_and_mapping_from_mca_parameters(launcher: Launcher) -> None:
    tagged = launcher.run("-q", "-np", "2", "echo", "hi", env={"OMPI_MCA_orte_tag_output": "1"})
    assert sorted(tagged.stdout.decode().splitlines()) == ["[1,0]<stdout>:hi", "[1,1]<stdout>:hi"]
    by_node = ("--launcher", "local", "--display-map", "-np", "4", "-H", "a:2,b:2", "true")
    shown = launcher.run(*by_node, env={"OMPI_MCA_rmaps_base_mapping_policy": "node"}).stdout.decode()
    assert "Data for node: a\tNum slots: 2\tMax slots: 0\tNum procs: 2\n \tRank 0\t" in shown
    assert "\tRank 2\t" in shown.split("Data for node: b")[0]  # round the hosts: 0 and 2 on a


@pytest.mark.skipif(not os.path.exists(DEBIAN_PYTHON), reason="needs Debian's python3-mpi4py")
def test_binding_policy_none_leaves_open_mpi_ranks_unbound(launcher: Launcher) -> None:
    args = ("-q", "--report-bindings", "-np", "2", DEBIAN_PYTHON, "-c", "from mpi4py import MPI")
    bound = launcher.run(*args).stderr.decode()
    assert "MCW rank 0 bound to" in bound  # Open MPI's default for two ranks: a core each
    unbound = launcher.run(*args, env={"OMPI_MCA_hwloc_base_binding_policy": "none"}).stderr.decode()
    assert "MCW rank 0 is not bound" in unbound and "MCW rank 1 is not bound" in unbound, unbound


# ---- -x and -H after a ' : ' -----------------------------------------------------------------------


def test_x_after_a_colon_is_that_programs_own(launcher: Launcher) -> None:
    """The usual way to give each program of an MPMD job its own device."""
    args = ["-np", "1", "-x", "DEV=0", "-x", "ALL=a", "sh", "-c", "echo $DEV$ALL"]
    args += [":", "-np", "1", "-x", "DEV=1", "sh", "-c", "echo $DEV$ALL"]
    proc = launcher.run("-q", *args)
    assert proc.returncode == 0, proc.stderr.decode()
    assert lines(proc) == ["0a", "1a"]  # the first program's -x is every program's, as Open MPI 5 reads it
    if MPIRUN:
        real = real_mpirun(launcher, *args)
        assert sorted(real.stdout.decode().split())[0:2] == ["0a", "1"]  # 4.1 gives the first -x to the first only


def test_h_after_a_colon_places_that_program_on_its_hosts(launcher: Launcher) -> None:
    args = (
        "--launcher",
        "local",
        "--display-map",
        "-np",
        "1",
        "-H",
        "a:2",
        "true",
        ":",
        "-np",
        "2",
        "-H",
        "b:2",
        "true",
    )
    shown = launcher.run(*args).stdout.decode()
    assert "Data for node: a\tNum slots: 2\tMax slots: 0\tNum procs: 1\n \tRank 0\tApp: 0 (true)" in shown, shown
    assert "Data for node: b\tNum slots: 2\tMax slots: 0\tNum procs: 2\n \tRank 1\tApp: 1 (true)" in shown, shown
    both = ("--launcher", "local", "--display-map", "-np", "2", "-H", "a,b", "true", ":", "-np", "1", "-H", "b", "true")
    shown = launcher.run(*both).stdout.decode()
    assert shown.split("Data for node: b")[1].count("App: 1") == 1 and "App: 1" not in shown.split("node: b")[0]


# ---- Open MPI's older and rarer words ----------------------------------------------------------------


def test_older_spellings_mean_what_they_meant(launcher: Launcher) -> None:
    pernode = launcher.run("--launcher", "local", "--display-map", "-pernode", "-H", "a:2,b:2", "true")
    assert pernode.returncode == 0 and pernode.stdout.decode().count("\tRank ") == 2  # one per host
    bound = launcher.run("-q", "--bind-to-core", "--report-bindings", "-np", "2", "true").stderr.decode()
    assert "MCW rank 0 bound to socket 0[core 0[hwt 0]]" in bound, bound
    gmca = launcher.run("-q", "-gmca", "btl", "self", "-np", "1", "sh", "-c", "echo $OMPI_MCA_btl")
    assert gmca.stdout == b"self\n"
    bycore = launcher.run("-q", "--bycore", "-np", "1", "true")
    assert bycore.returncode == 0, bycore.stderr.decode()


def test_flags_that_mean_nothing_here_are_said_once(launcher: Launcher) -> None:
    proc = launcher.run("--continuous", "--enable-recovery", "-novm", "-np", "1", "true")
    assert proc.returncode == 0
    assert proc.stderr.decode().splitlines() == [
        "mpilaunch: mpirun's --continuous means nothing here: ignored",
        "mpilaunch: mpirun's --enable-recovery means nothing here: ignored",
        "mpilaunch: mpirun's --novm means nothing here: ignored",
    ]


def test_nolocal_runs_no_rank_here(launcher: Launcher) -> None:
    shown = launcher.run("--launcher", "local", "--display-map", "--nolocal", "-np", "2", "-H", "localhost,b:2", "true")
    assert "Data for node: b\tNum slots: 2" in shown.stdout.decode() and "node: localhost" not in shown.stdout.decode()
    alone = launcher.run("--nolocal", "-np", "1", "true")
    assert alone.returncode == 2
    assert alone.stderr.decode() == (
        "mpilaunch: --nolocal: every host of the job (localhost (no hosts given)) is this machine\n"
    )


def test_a_rankfile_is_refused_in_one_line(launcher: Launcher) -> None:
    for word in ("-rf", "--rankfile"):
        proc = launcher.run(word, "ranks.txt", "-np", "1", "true")
        assert proc.returncode == 2
        assert proc.stderr.decode().startswith("mpilaunch: --rankfile ranks.txt: mpilaunch does not read rankfiles;")


@pytest.mark.parametrize("words", [["--nooversubscribe"], ["--map-by", "slot:NOOVERSUBSCRIBE"]])
def test_nooversubscribe_asked_for_holds_this_machine_to_its_cores(launcher: Launcher, words: list[str]) -> None:
    cores = len(os.sched_getaffinity(0))
    plain = launcher.run("-q", "-np", str(cores + 1), "true")
    assert plain.returncode == 0, plain.stderr.decode()  # mpilaunch's own default: a note, and it runs
    held = launcher.run(*words, "-np", str(cores + 1), "true")
    assert held.returncode == 2 and b"not enough slots" in held.stderr


def test_an_app_file_runs_its_lines_each_with_its_own_x(launcher: Launcher) -> None:
    (launcher.tmp_path / "apps").write_text("# Open MPI's appfile\n-np 1 -x FOO=7 printenv FOO\n-np 2 printenv FOO\n")
    proc = launcher.run("-q", "--oversubscribe", "--app", "apps", env={"FOO": "0"})
    assert proc.returncode == 0, proc.stderr.decode()
    assert lines(proc) == ["0", "0", "7"]
    if MPIRUN:
        real = real_mpirun(launcher, "--oversubscribe", "--app", "apps", env={"FOO": "0"})
        assert lines(real) == ["0", "0", "7"]


def test_prefix_leads_this_machines_ranks_paths_too(launcher: Launcher, tmp_path) -> None:
    prefix = str(tmp_path / "openmpi")
    args = ("--prefix", prefix, "-np", "1", "sh", "-c", "echo ${PATH%%:*} ${LD_LIBRARY_PATH%%:*}")
    proc = launcher.run("-q", *args)
    assert proc.stdout.decode().split() == [f"{prefix}/bin", f"{prefix}/lib"], proc.stderr.decode()
    if MPIRUN:
        assert real_mpirun(launcher, *args).stdout.decode().split() == [f"{prefix}/bin", f"{prefix}/lib"]


def test_an_app_file_keeps_the_line_open_mpis(launcher: Launcher) -> None:
    """--app is Open MPI's word: -H keeps Open MPI's slots (hydra's -configfile would make it
    hydra's host list, which wraps round)."""
    (launcher.tmp_path / "apps").write_text("-np 2 true\n")
    proc = launcher.run("-H", "localhost:1", "--app", "apps")
    assert proc.returncode == 2 and b"not enough slots" in proc.stderr, proc.stderr.decode()
