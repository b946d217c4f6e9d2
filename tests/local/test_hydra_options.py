"""hydra's spellings (MPICH's and Intel MPI's `mpiexec`), as mpilaunch reads them: -genv, -env,
-genvlist, -genvall, -ppn, -hosts, -l, -configfile, -launcher; and an unknown single-dash word
named whole, not as a split of its letters (issue "Every MPI at full speed")."""

from __future__ import annotations

import os
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


def test_genvall_sends_the_launchers_variables_and_genvnone_is_the_default(launcher: Launcher) -> None:
    env = {**os.environ, "KEPT": "yes"}
    shown = launcher.run("--dry-run", "-genvall", "-n", "1", "true", env=env)
    assert shown.returncode == 0, shown.stderr.decode()
    assert "KEPT=yes" in shown.stdout.decode()  # an export now: remote ranks get it too
    plain = launcher.run("--dry-run", "-genvnone", "-n", "1", "true", env=env)
    assert plain.returncode == 0 and "KEPT=yes" not in plain.stdout.decode()
    both = launcher.run("-genvall", "-genvnone", "-n", "1", "true")
    assert both.returncode == 2 and both.stderr.decode() == "mpilaunch: -genvall and -genvnone: give one of them\n"


def test_ppn_and_hosts_place_as_npernode_and_host(launcher: Launcher) -> None:
    hydra = launcher.run("--dry-run", "-hosts", "a:2,b:2", "-ppn", "1", "-n", "2", "true")
    ompi = launcher.run("--dry-run", "-H", "a:2,b:2", "--npernode", "1", "-n", "2", "true")
    assert hydra.returncode == 0, hydra.stderr.decode()
    job_map = hydra.stdout.split(b"rank 0 on")[0]
    assert job_map == ompi.stdout.split(b"rank 0 on")[0] and b"Rank 1" in job_map
    assert b"Data for node: b\tNum slots: 2\tMax slots: 0\tNum procs: 1" in job_map


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


@pytest.mark.parametrize("word", ["-genvx", "-configfilex", "-colors", "-n4x", "-lx", "-ppnx"])
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


def test_where_hydra_and_open_mpi_differ_the_refusal_says_so(launcher: Launcher) -> None:
    hydra = launcher.run("-hosts", "localhost:1", "-n", "2", "true")
    assert hydra.returncode == 2
    assert "hydra would place the extra ranks round-robin; mpilaunch does as Open MPI does" in hydra.stderr.decode()
    ompi = launcher.run("-H", "localhost:1", "-n", "2", "true")
    assert ompi.returncode == 2 and b"hydra" not in ompi.stderr
