"""The Slurm engine's pure parts (transport/slurm_step.py, plan/build.py, entry.py): the srun step
for N nodes or the whole allocation, the agent's command line (no secret on it), when --launcher
auto picks Slurm, and when the step starts before the launch. More nodes
than one cannot run here (Debian's Slurm has no multiple-slurmd): these are what is run there."""

from __future__ import annotations

import shlex

from mpilaunch.plan.build import in_slurm_allocation
from mpilaunch.transport.slurm_step import SECRET_VAR, agent_shell, srun_command


def test_one_agent_per_node_with_every_cpu_and_no_binding() -> None:
    argv = srun_command(["n1", "n2", "n3"], "AGENT", srun="/usr/bin/srun")
    assert argv[0] == "/usr/bin/srun" and argv[-3:] == ["sh", "-c", "AGENT"]
    flags = set(argv[1:-3])
    assert {"--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--nodelist=n1,n2,n3"} <= flags
    assert {"--cpu-bind=none", "--whole", "--kill-on-bad-exit=1", "--overlap", "--input=none"} <= flags


def test_the_agent_line_carries_no_secret_and_connects_back() -> None:
    line = agent_shell("head-node", 40123, "/opt/py/bin/python3")
    assert line.startswith('p=/opt/py/bin/python3; [ -x "$p" ] || p=python3; exec "$p" -S -c ')
    code = shlex.split(line.split(" -S -c ", 1)[1])[0]  # the Python program, as the shell passes it
    compile(code, "agent", "exec")
    assert "s.connect((b'head-node', 40123))" in code and "TCP_NODELAY, 1)" in code and "import socket" not in code
    assert f'os.environ.pop("{SECRET_VAR}"' in code
    assert "SLURMD_NODENAME" in code and "mpilaunch-agent" in code


def test_a_step_over_the_whole_allocation_names_no_node() -> None:
    argv = srun_command(4, "AGENT", srun="srun")
    assert {"--nodes=4", "--ntasks=4", "--ntasks-per-node=1"} <= set(argv)
    assert not [word for word in argv if word.startswith("--nodelist")]


def early_start(args: list[str], env: dict[str, str]) -> int:
    """What entry.main starts first for this command line in this environment."""
    from mpilaunch.cli.cmdline import read
    from mpilaunch.entry import early_start

    return early_start(read(args), env)


def test_the_step_starts_early_only_where_the_job_surely_runs_in_it() -> None:
    from mpilaunch.entry import LOCAL_AGENT

    salloc = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_NUM_NODES": "3"}
    assert early_start(["-n", "2", "true"], salloc) == 3  # this test runs under no slurmstepd
    assert early_start(["-n", "2", "true"], {**salloc, "SLURM_JOB_NUM_NODES": "", "SLURM_NNODES": "2"}) == 2
    assert early_start(["-n", "2", "true"], {}) == LOCAL_AGENT
    assert early_start(["-H", "n1:2", "-n", "2", "true"], salloc) == LOCAL_AGENT  # hosts by hand
    assert early_start(["--launcher=ssh", "true"], salloc) == LOCAL_AGENT
    assert early_start(["--hostfile", "f", "true"], salloc) == LOCAL_AGENT
    assert early_start(["--dry-run", "true"], salloc) == 0
    assert early_start(["check"], salloc) == 0
    assert early_start(["--version"], salloc) == 0
    assert early_start(["-H", "a", "-ppn", "1", "true"], salloc) == 0  # refused as it is read
    assert early_start(["-hosts", "n1", "true"], salloc) == LOCAL_AGENT  # hydra's hosts, by hand
    assert early_start(["-n", "2", "sh", "-c", "x", "--dry-run"], salloc) == 3  # the program's own words
    assert early_start(["-n", "2", "--no-such-option", "true"], salloc) == 3  # click refuses it: the step ends
    assert early_start(["-H", "n1", "--no-such-option", "true"], salloc) == LOCAL_AGENT  # ... hosts by hand
    assert early_start(["true"], {**salloc, "MLP_MPI_HOSTS": "a,b"}) == 0  # those hosts come first
    assert early_start(["true"], {**salloc, "SLURM_JOB_NODELIST": ""}) == 0
    assert early_start(["true"], {**salloc, "SLURM_JOB_NUM_NODES": "x"}) == 0


def test_auto_is_slurm_only_inside_an_allocation_whose_hosts_are_used() -> None:
    inside = {"SLURM_JOB_ID": "12"}
    assert in_slurm_allocation(inside, "Slurm allocation (SLURM_JOB_NODELIST)")
    assert not in_slurm_allocation(inside, "-H")  # hosts given by hand: SSH, as before
    assert not in_slurm_allocation({}, "Slurm allocation (SLURM_JOB_NODELIST)")


def test_no_agent_is_forked_early_where_srun_starts_them() -> None:
    from mpilaunch.entry import LOCAL_AGENT

    inside = {"SLURM_JOB_ID": "7"}
    assert early_start(["-n", "2", "true"], {}) == LOCAL_AGENT
    assert early_start(["-n", "2", "true"], inside) != LOCAL_AGENT  # hosts from Slurm: srun starts the agents
    assert early_start(["-H", "localhost:2", "-n", "2", "true"], inside) == LOCAL_AGENT  # hosts by hand: as before
    assert early_start(["--launcher=ssh", "-n", "2", "true"], inside) == LOCAL_AGENT
    assert early_start(["--dry-run", "true"], {}) != LOCAL_AGENT


def test_in_a_batch_step_this_nodes_agent_is_forked() -> None:
    from mpilaunch.plan.build import over_ssh
    from mpilaunch.plan.hosts import Host
    from mpilaunch.plan.spec import Options

    here, there = Host(name="localhost", slots=2), Host(name="node7", slots=2)
    salloc = Options(launcher="slurm")
    sbatch = Options(launcher="slurm", in_slurm_step=True)
    assert over_ssh(salloc, here) and over_ssh(salloc, there)  # srun starts every agent
    assert not over_ssh(sbatch, here) and over_ssh(sbatch, there)  # this node's: forked, in the batch step
