"""The Grid Engine engine's pure parts (plan/hostsources.py, plan/build.py, transport/sge.py):
PE_HOSTFILE and NSLOTS, when --launcher auto picks Grid Engine, when this machine's agent goes
through qrsh too (in the words hydra's and Open MPI's users know), the qrsh line (no secret on
it) and which qrsh runs. A job on more than one host cannot run here (one execd per machine):
these are what is run there."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from mpilaunch.errors import LaunchError
from mpilaunch.plan.build import engine_starts_here, in_sge_job, over_ssh
from mpilaunch.plan.hosts import Host
from mpilaunch.plan.hostsources import parse_pe_hostfile, sge_nslots
from mpilaunch.plan.spec import Options
from mpilaunch.transport.sge import qrsh_command, qrsh_program
from mpilaunch.transport.stage1 import SECRET_VAR, connect_back_line

PE_FILE = "n2 2 all.q@n2 UNDEFINED\nn1 1 all.q@n1 0,1\n\nn2 1 gpu.q@n2 UNDEFINED\n"


def test_pe_hostfile_sums_each_hosts_queues_and_keeps_the_master_first() -> None:
    assert parse_pe_hostfile(PE_FILE, "pe") == [Host("n2", 3), Host("n1", 1)]


@pytest.mark.parametrize(
    "text, said",
    [
        ("n1\n", r"^PE_HOSTFILE: pe:1: expected `host slots queue range`, not 'n1'$"),
        ("n1 2 q@n1 U\n-x 1 q@x U\n", r"^PE_HOSTFILE: pe:2: invalid host name '-x'$"),
        ("n1 two q@n1 U\n", r"^PE_HOSTFILE: pe:1: slot count must be a whole number from 1 to 1000000, not 'two'$"),
        ("n1 0 q@n1 U\n", r"slot count must be a whole number"),
        ("\n\n", r"^PE_HOSTFILE: pe: no hosts in the file$"),
    ],
)
def test_a_bad_pe_hostfile_is_one_line_naming_the_file_and_line(text: str, said: str) -> None:
    with pytest.raises(LaunchError, match=said):
        parse_pe_hostfile(text, "pe")


def test_nslots() -> None:
    assert sge_nslots({}) is None
    assert sge_nslots({"NSLOTS": " 4 "}) == 4
    for bad in ("0", "x", "-1", "9" * 40):
        with pytest.raises(LaunchError, match=r"^NSLOTS="):
            sge_nslots({"NSLOTS": bad})


def test_auto_is_sge_only_inside_a_job_whose_pe_hosts_are_used() -> None:
    inside = {"JOB_ID": "12", "SGE_ROOT": "/var/lib/gridengine"}
    source = "Grid Engine job's PE_HOSTFILE /spool/active_jobs/12.1/pe_hostfile"
    assert in_sge_job(inside, source)
    assert not in_sge_job(inside, "-H")  # hosts by hand: SSH, as before
    assert not in_sge_job({"JOB_ID": "12"}, source)  # no cell
    assert not in_sge_job({}, source)


@pytest.mark.parametrize(
    "env, mca, forced",
    [
        ({}, (), False),
        ({"HYDRA_LAUNCHER_AUTOFORK": "0"}, (), True),
        ({"HYDRA_LAUNCHER_AUTOFORK": "no"}, (), True),
        ({"HYDRA_LAUNCHER_AUTOFORK": "1"}, (), False),
        ({}, (("ras_base_launch_orted_on_hn", "1"),), True),
        ({}, (("ras_base_launch_orted_on_hn", "true"),), True),
        ({}, (("ras_base_launch_orted_on_hn", "0"),), False),
        ({"OMPI_MCA_ras_base_launch_orted_on_hn": "1"}, (), True),
        ({"OMPI_MCA_ras_base_launch_orted_on_hn": "1"}, (("ras_base_launch_orted_on_hn", "0"),), False),
    ],
)
def test_this_hosts_agent_goes_through_qrsh_only_when_asked_in_peers_words(
    env: dict[str, str], mca: tuple[tuple[str, str], ...], forced: bool
) -> None:
    options = Options(launcher="sge", mca=mca)
    assert engine_starts_here(options, env) is forced
    here, there = Host("localhost", 2), Host("node7", 2)
    planned = options._replace(engine_starts_here=engine_starts_here(options, env))
    assert over_ssh(planned, here) is forced and over_ssh(planned, there)  # the others: always qrsh


def test_the_qrsh_line_carries_no_secret_and_connects_back() -> None:
    line = connect_back_line("head", 40123, "/opt/py/bin/python3", repr("3"))
    argv = qrsh_command("/sge/bin/lx-amd64/qrsh", "n7", line)
    assert argv[:5] == ["/sge/bin/lx-amd64/qrsh", "-inherit", "-nostdin", "-V", "n7"] and argv[5] == line
    words = shlex.split(argv[5])  # one word: the task's shell parses it again, as over ssh
    code = words[words.index("-c") + 1]
    compile(code, "agent", "exec")
    assert "w = '3'" in code and "s.connect((b'head', 40123))" in code
    assert f'os.environ.pop("{SECRET_VAR}"' in code and "mpilaunch-agent" in code


def test_the_jobs_own_qrsh_is_used(tmp_path: Path) -> None:
    """$SGE_ROOT/bin/$ARC/qrsh, as Open MPI finds it; else qrsh on PATH; else one line."""
    own = tmp_path / "root" / "bin" / "lx-amd64"
    own.mkdir(parents=True)
    on_path = tmp_path / "path"
    on_path.mkdir()
    for folder in (own, on_path):
        (folder / "qrsh").write_text("#!/bin/sh\n")
        (folder / "qrsh").chmod(0o755)
    root = str(tmp_path / "root")
    assert qrsh_program({"SGE_ROOT": root, "ARC": "lx-amd64", "PATH": str(on_path)}) == str(own / "qrsh")
    assert qrsh_program({"SGE_ROOT": root, "ARC": "lx-x86", "PATH": str(on_path)}) == str(on_path / "qrsh")
    with pytest.raises(LaunchError, match=r"^--launcher sge: no `qrsh` found in \$SGE_ROOT/bin/\$ARC or on PATH$"):
        qrsh_program({"SGE_ROOT": root, "ARC": "lx-x86", "PATH": str(tmp_path)})


def test_bootstrap_sge_is_the_engine_not_a_note() -> None:
    from mpilaunch.cli.cmdline import read
    from mpilaunch.cli.parse import parse_args

    spec = parse_args(read(["-bootstrap", "sge", "-n", "1", "true"], "mpiexec"))
    assert spec.options.launcher == "sge" and not any("-bootstrap" in note for note in spec.options.notes)
