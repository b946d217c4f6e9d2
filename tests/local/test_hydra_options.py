"""hydra's spellings (MPICH's and Intel MPI's `mpiexec`), as mpilaunch reads them: -genv, -env,
-genvlist, -genvall, -ppn, -hosts, -l, -configfile, -launcher; and an unknown single-dash word
named whole, not as a split of its letters (issue "Every MPI at full speed")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Launcher

SHOW = "echo $OMPI_COMM_WORLD_RANK ${FOO-unset} ${BAR-unset} ${BAZ-unset} ${KEPT-unset}"


def _rows(out: bytes) -> list[list[str]]:
    return sorted(line.split() for line in out.decode().splitlines())


def test_genv_env_and_genvlist_reach_the_ranks_they_name(launcher: Launcher) -> None:
    env = {**os.environ, "KEPT": "from-launcher"}
    proc = launcher.run(
        "--oversubscribe", "-genv", "FOO", "1", "-genvlist", "KEPT", "-n", "2", "-env", "BAR", "2", "sh", "-c", SHOW,
        ":", "-n", "1", "-env", "BAZ", "3", "sh", "-c", SHOW, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    assert _rows(proc.stdout) == [
        ["0", "1", "2", "unset", "from-launcher"],
        ["1", "1", "2", "unset", "from-launcher"],
        ["2", "1", "unset", "3", "from-launcher"],
    ]


def test_genvall_sends_the_launchers_variables_and_is_hydras_default(launcher: Launcher) -> None:
    """-genvall exports the launcher's environment (remote ranks get it too); a line in hydra's
    words does so unless -genvnone or -genvlist says otherwise; Open MPI's line does not."""
    env = {**os.environ, "KEPT": "yes"}
    shown = launcher.run("--dry-run", "-genvall", "-n", "1", "true", env=env)
    assert shown.returncode == 0, shown.stderr.decode()
    assert "KEPT=yes" in shown.stdout.decode()  # an export now: remote ranks get it too
    for words, kept in (
        (["-genv", "A=1"], True),
        (["-hosts", "localhost"], True),
        (["-genv", "A=1", "-genvnone"], False),
        (["-genvlist", "A"], False),
        (["-x", "A=1"], False),
        ([], False),
    ):
        plain = launcher.run("--dry-run", *words, "-n", "1", "true", env=env)
        assert plain.returncode == 0 and ("KEPT=yes" in plain.stdout.decode()) == kept, words
    both = launcher.run("-genvall", "-genvnone", "-n", "1", "true")
    assert both.returncode == 2 and both.stderr.decode() == "mpilaunch: -genvall and -genvnone: give one of them\n"


HYDRA = Path(sys.executable).parent / "mpiexec.hydra"  # the mpich wheel's (the test extra)
SHAPES = [  # hydra's placement words, as MPICH's mpiexec reads them
    ["-hosts", "h1,h2", "-ppn", "2", "-n", "6"],
    ["-hosts", "h1:3,h2", "-n", "6"],
    ["-hosts", "h1:3,h2", "-ppn", "1", "-n", "5"],
    ["-hosts", "h1,h2", "-n", "3"],
    ["-hosts", "h1,h2,h1", "-n", "4"],
    ["-hosts", "h1:2,h2:2", "-n", "5"],
    ["-hosts", "h1,h2"],
    ["-hosts", "h1:2,h2", "-ppn", "3"],
    ["-f", "HOSTFILE", "-n", "7"],
    ["-f", "HOSTFILE", "-ppn", "1", "-n", "3"],
    ["-hosts", "h1:2,h2:2", "-n", "2", "PROG", ":", "-n", "3"],
    ["-f", "NODEFILE", "-ppn", "1", "-n", "2"],  # a host once per slot, as $PBS_NODEFILE: repeats merge
    ["-f", "NODEFILE", "-n", "6"],
    ["-hosts", "h1,h1,h2,h2", "-ppn", "1", "-n", "4"],
    ["-hosts", "h1:2,h1:1,h2", "-ppn", "1", "-n", "4"],
    ["-hosts", "h1,h1,h2,h1", "-ppn", "1", "-n", "6"],  # only an entry repeating the one before merges
]


def _with_program(args: list[str], program: list[str]) -> list[str]:
    """The shape's words with the program after each app context (PROG marks an inner one)."""
    return [w for a in args for w in (program if a == "PROG" else [a])] + program


def _hydra_map(args: list[str], tmp_path: Path) -> list[str]:
    """rank:host of each rank as hydra places them (its fork launcher: nothing leaves this machine)."""
    words = _with_program(args, ["sh", "-c", "echo $PMI_RANK $PMI_HOSTNAME"])
    for _ in range(3):  # hydra itself dies of a SIGPIPE now and then on a busy machine: its trouble, not the map's
        proc = subprocess.run([str(HYDRA), "-launcher", "fork", *words], capture_output=True, text=True, timeout=60)
        if proc.returncode >= 0:
            break
    assert proc.returncode == 0, proc.stderr
    pairs = sorted((int(rank), host) for rank, host in (line.split() for line in proc.stdout.splitlines()))
    return [f"{rank}:{host}" for rank, host in pairs]


def _our_map(launcher: Launcher, args: list[str]) -> list[str]:
    """rank:host of each rank as mpilaunch places them (-print-rank-map of a dry run)."""
    proc = launcher.run("-print-rank-map", "--dry-run", *_with_program(args, ["true"]))
    assert proc.returncode == 0, proc.stderr.decode()
    placed = []
    for line in proc.stdout.decode().splitlines():
        if line.startswith("(") and line.endswith(")"):
            host, ranks = line[1:-1].split(":")
            placed += [(int(r), host) for r in ranks.split(",")]
    return [f"{rank}:{host}" for rank, host in sorted(placed)]


@pytest.mark.skipif(not HYDRA.exists(), reason="MPICH's hydra (the mpich wheel of the test extra) is not installed")
@pytest.mark.parametrize("args", SHAPES, ids=[" ".join(a) for a in SHAPES])
def test_hosts_ppn_and_f_place_as_hydra_does(launcher: Launcher, tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "hosts").write_text("h1:2\nh2:3\n")
    (tmp_path / "nodes").write_text("h1\nh1\nh2\nh2\n")
    files = {"HOSTFILE": str(tmp_path / "hosts"), "NODEFILE": str(tmp_path / "nodes")}
    args = [files.get(a, a) for a in args]
    assert _our_map(launcher, args) == _hydra_map(args, tmp_path)


def test_hydra_placement_has_no_slot_limit_and_open_mpis_keeps_it(launcher: Launcher) -> None:
    hydra = launcher.run("-hosts", "localhost:1", "-n", "2", "sh", "-c", "echo $PMI_RANK")
    assert hydra.returncode == 0, hydra.stderr.decode()
    assert sorted(hydra.stdout.split()) == [b"0", b"1"]
    ppn = launcher.run("-hosts", "localhost", "-ppn", "4", "-np", "4", "true")
    assert ppn.returncode == 0, ppn.stderr.decode()
    ompi = launcher.run("-H", "localhost:1", "-n", "2", "true")
    assert ompi.returncode == 2 and b"not enough slots" in ompi.stderr and b"hydra" not in ompi.stderr


@pytest.mark.parametrize(
    ("words", "first", "second"),
    [
        (["-H", "a:2", "-ppn", "1"], "-H", "-ppn"),
        (["--npernode", "1", "-hosts", "a,b"], "--npernode", "-hosts"),
        (["--map-by", "node", "-f", "HOSTFILE"], "--map-by", "-f"),
        (["-hosts", "a", "--rank-by", "node"], "--rank-by", "-hosts"),
    ],
)
def test_open_mpi_and_hydra_placement_together_is_one_line(
    launcher: Launcher, tmp_path: Path, words: list[str], first: str, second: str
) -> None:
    (tmp_path / "hosts").write_text("a\n")
    words = [str(tmp_path / "hosts") if w == "HOSTFILE" else w for w in words]
    proc = launcher.run(*words, "-n", "1", "true")
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.count("\n") == 1, err
    assert f"{first} places ranks as Open MPI's mpirun does and {second} as hydra's mpiexec does" in err


def test_l_prefixes_every_line_with_its_rank(launcher: Launcher) -> None:
    proc = launcher.run("--oversubscribe", "-l", "-n", "3", "sh", "-c", "echo a; echo b")
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(proc.stdout.decode().splitlines()) == sorted(f"[{r}] {x}" for r in range(3) for x in "ab")


def test_configfile_lines_are_app_contexts(launcher: Launcher, tmp_path: Path) -> None:
    config = tmp_path / "apps"
    lines = ["# two programs", "-n 2 sh -c 'echo one $OMPI_COMM_WORLD_RANK'", "", "-n 1 -env X y sh -c 'echo two $X'"]
    config.write_text("\n".join(lines) + "\n")
    proc = launcher.run("--oversubscribe", "-configfile", str(config))
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(proc.stdout.decode().splitlines()) == ["one 0", "one 1", "two y"]


def test_a_configfile_line_ending_in_a_backslash_goes_on(launcher: Launcher, tmp_path: Path) -> None:
    config = tmp_path / "apps"
    config.write_text("-n 2 \\\n  sh -c 'echo one' \\\n\n-n 1 \\\n echo two\n")
    proc = launcher.run("--oversubscribe", "-configfile", str(config))
    assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(proc.stdout.decode().splitlines()) == ["one", "one", "two"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read configfile"),
        ("-n 1 sh -c 'unclosed\n", ":1: No closing quotation"),
        ("# nothing\n", "configfile with no app context in it"),
        ("-n 1 true\n-configfile other\n", ":2: a configfile cannot name another one"),
    ],
)
def test_a_bad_configfile_is_one_line(launcher: Launcher, tmp_path: Path, text: str | None, message: str) -> None:
    config = tmp_path / "apps"
    if text is not None:
        config.write_text(text)
    proc = launcher.run("-configfile", str(config))
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.count("\n") == 1 and message in err and str(config) in err, err


UNKNOWN = ["-genvx", "-configfilex", "-colors", "-n4x", "-lx", "-ppnx", "-topolib", "-rankmap", "-tv", "-rr"]
# (-rf is Open MPI's rankfile, refused by its own name: tests/local/test_mpirun_words.py)


@pytest.mark.parametrize("word", UNKNOWN)
def test_an_unknown_single_dash_word_is_named_whole(launcher: Launcher, word: str) -> None:
    proc = launcher.run(word, "1", "true")
    assert proc.returncode == 2
    assert proc.stderr.decode() == f"mpilaunch: unknown option '{word}'; `mpilaunch --help` lists them\n"


def test_launcher_local_starts_an_agent_per_host_here(launcher: Launcher) -> None:
    proc = launcher.run(
        "--launcher", "local", "-H", "node1:2,node2:2", "-n", "4", "sh", "-c",
        "echo $OMPI_COMM_WORLD_RANK $OMPI_COMM_WORLD_LOCAL_RANK $OMPI_COMM_WORLD_NODE_RANK $PPID",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    rows = _rows(proc.stdout)
    assert [row[:2] for row in rows] == [["0", "0"], ["1", "1"], ["2", "0"], ["3", "1"]]
    agents = {row[0]: row[3] for row in rows}
    assert agents["0"] == agents["1"] != agents["2"] == agents["3"]  # two agents, one per host name


def test_iface_names_the_interface_to_every_library_and_yours_win(launcher: Launcher) -> None:
    proc = launcher.run("--dry-run", "-iface", "eth1", "-x", "NCCL_SOCKET_IFNAME=ib0", "-n", "1", "true")
    assert proc.returncode == 0, proc.stderr.decode()
    shown = proc.stdout.decode()
    for name in ("FI_TCP_IFACE", "FI_SOCKETS_IFACE", "OMPI_MCA_btl_tcp_if_include", "GLOO_SOCKET_IFNAME"):
        assert f"  {name}=eth1\n" in shown
    assert "  NCCL_SOCKET_IFNAME=ib0\n" in shown
    bad = launcher.run("-iface", "eth0;reboot", "-n", "1", "true")
    assert bad.returncode == 2
    assert bad.stderr.decode() == "mpilaunch: -iface 'eth0;reboot': not a network interface name\n"


def test_hydras_variables_are_read_on_a_line_in_hydras_words(launcher: Launcher, tmp_path: Path) -> None:
    """HYDRA_HOST_FILE, HYDRA_LAUNCHER/HYDRA_BOOTSTRAP and HYDRA_IFACE, as hydra reads them; an
    option given wins, and Open MPI's line does not read them."""
    (tmp_path / "nodes").write_text("a\nb\n")
    shown = ["--dry-run", "-print-rank-map", "-genv", "A=1"]
    hostfile = {"HYDRA_HOST_FILE": str(tmp_path / "nodes")}
    for words, env, first in (
        ([*shown, "-n", "3"], hostfile, "(a:0,2)"),
        ([*shown, "-hosts", "c", "-n", "3"], hostfile, "(c:0,1,2)"),
        (["--dry-run", "--display-map", "-x", "A=1", "-n", "1"], hostfile, ""),
        ([*shown, "-n", "1"], {"HYDRA_IFACE": "eth1"}, "  FI_TCP_IFACE=eth1"),
        ([*shown, "-iface", "eth2", "-n", "1"], {"HYDRA_IFACE": "eth1"}, "  FI_TCP_IFACE=eth2"),
    ):
        proc = launcher.run(*words, "true", env=env)
        out = proc.stdout.decode()
        assert proc.returncode == 0, proc.stderr.decode()
        assert (first in out.splitlines()) if first else ("localhost" in out and "(a:" not in out), (words, out)
    fork = launcher.run(
        "-genv", "A=1", "-hosts", "node1,node2", "-n", "2", "sh", "-c", "echo $PMI_RANK", env={"HYDRA_LAUNCHER": "fork"}
    )
    assert fork.returncode == 0 and sorted(fork.stdout.split()) == [b"0", b"1"], fork.stderr.decode()
    bad = launcher.run("-genv", "A=1", "-n", "1", "true", env={"HYDRA_BOOTSTRAP": "bogus"})
    assert bad.returncode == 2 and bad.stderr.decode().startswith("mpilaunch: HYDRA_BOOTSTRAP='bogus': expected one of")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_bind_to_core_with_a_count_gives_each_rank_that_many_cores(launcher: Launcher) -> None:
    """hydra's -bind-to core:2 (a hybrid MPI + OpenMP rank's cores); Open MPI's qualifiers
    (core:overload-allowed) still bind to one."""
    words = ("-n", "1", "sh", "-c", "grep Cpus_allowed_list /proc/self/status")
    two = launcher.run("-q", "-bind-to", "core:2", *words)
    one = launcher.run("-q", "--bind-to", "core:overload-allowed", *words)
    cpus = sorted(os.sched_getaffinity(0))
    assert two.stdout.decode().split()[-1] == f"{cpus[0]}-{cpus[1]}", two.stderr.decode()
    assert one.stdout.decode().split()[-1] == str(cpus[0]), one.stderr.decode()
    if HYDRA.exists():
        real = subprocess.run([str(HYDRA), "-bind-to", "core:2", *words], capture_output=True, timeout=60)
        assert real.stdout.split()[-1] == two.stdout.split()[-1]


def test_prepend_pattern_labels_each_console_line_as_hydra_does(launcher: Launcher) -> None:
    words = ("-prepend-pattern", "[%r@%p] ", "-n", "2", "sh", "-c", "echo out; echo err >&2")
    proc = launcher.run("-q", *words)
    assert sorted(proc.stdout.decode().splitlines()) == ["[0@0] out", "[1@0] out"], proc.stderr.decode()
    assert sorted(proc.stderr.decode().splitlines()) == ["[0@0] err", "[1@0] err"]
    if HYDRA.exists():
        real = subprocess.run([str(HYDRA), *words], capture_output=True, timeout=60)
        assert sorted(real.stdout.decode().splitlines()) == ["[0@0] out", "[1@0] out"]


def test_skip_launch_node_is_nolocal(launcher: Launcher) -> None:
    """hydra's -skip-launch-node, one row of cli/hydra_words.py (docs/architecture.md, "How to add
    a word"), is --nolocal: no rank on this machine; with -hosts the list's other entries take the
    ranks round-robin, as hydra's do (before: an unknown option; --nolocal with -hosts, a traceback)."""
    line = ("-hosts", "localhost,node1:2,localhost,node2", "-n", "4", "--dry-run", "true")
    for word in ("-skip-launch-node", "--nolocal"):
        proc = launcher.run(word, *line)
        assert proc.returncode == 0, proc.stderr.decode()
        placed = [row.split(b":")[0] for row in proc.stdout.splitlines() if row.startswith(b"rank ")]
        assert placed == [b"rank 0 on node1", b"rank 1 on node1", b"rank 2 on node2", b"rank 3 on node1"]
    alone = launcher.run("-skip-launch-node", "-n", "1", "true")
    assert alone.returncode == 2 and alone.stderr == launcher.run("--nolocal", "-n", "1", "true").stderr
    assert alone.stderr.count(b"\n") == 1
