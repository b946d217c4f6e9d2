"""The Slurm engine's pure parts (transport/slurm.py, plan/build.py): the srun step for N nodes,
the agent's command line (no secret on it), and when --launcher auto picks Slurm. More nodes
than one cannot run here (Debian's Slurm has no multiple-slurmd): these are what is run there."""

from __future__ import annotations

import shlex

from mpilaunch.plan.build import in_slurm_allocation
from mpilaunch.transport.slurm import SECRET_VAR, agent_shell, srun_command


def test_one_agent_per_node_with_every_cpu_and_no_binding() -> None:
    argv = srun_command(["n1", "n2", "n3"], "AGENT", srun="/usr/bin/srun")
    assert argv[0] == "/usr/bin/srun" and argv[-3:] == ["sh", "-c", "AGENT"]
    flags = set(argv[1:-3])
    assert {"--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--nodelist=n1,n2,n3"} <= flags
    assert {"--cpu-bind=none", "--whole", "--kill-on-bad-exit=1", "--overlap", "--input=none"} <= flags


def test_the_agent_line_carries_no_secret_and_connects_back() -> None:
    line = agent_shell("head-node", 40123, "/opt/py/bin/python3")
    assert line.startswith("p=/opt/py/bin/python3; [ -x \"$p\" ] || p=python3; exec \"$p\" -S -c ")
    code = shlex.split(line.split(" -S -c ", 1)[1])[0]  # the Python program, as the shell passes it
    compile(code, "agent", "exec")
    assert "create_connection(('head-node', 40123))" in code and f'os.environ.pop("{SECRET_VAR}"' in code
    assert "SLURMD_NODENAME" in code and "mpilaunch-agent" in code


def test_auto_is_slurm_only_inside_an_allocation_whose_hosts_are_used() -> None:
    inside = {"SLURM_JOB_ID": "12"}
    assert in_slurm_allocation(inside, "Slurm allocation (SLURM_JOB_NODELIST)")
    assert not in_slurm_allocation(inside, "-H")  # hosts given by hand: SSH, as before
    assert not in_slurm_allocation({}, "Slurm allocation (SLURM_JOB_NODELIST)")


def test_no_agent_is_forked_early_where_srun_starts_them() -> None:
    from mpilaunch.entry import starts_a_job_here

    inside = {"SLURM_JOB_ID": "7"}
    assert starts_a_job_here(["-n", "2", "true"], {})
    assert not starts_a_job_here(["-n", "2", "true"], inside)  # hosts from Slurm: srun starts the agents
    assert starts_a_job_here(["-H", "localhost:2", "-n", "2", "true"], inside)  # hosts by hand: as before
    assert starts_a_job_here(["--launcher=ssh", "-n", "2", "true"], inside)
    assert not starts_a_job_here(["--dry-run", "true"], {})


def test_in_a_batch_step_this_nodes_agent_is_forked() -> None:
    from mpilaunch.plan.build import over_ssh
    from mpilaunch.plan.hosts import Host
    from mpilaunch.plan.spec import Options

    here, there = Host(name="localhost", slots=2), Host(name="node7", slots=2)
    salloc = Options(launcher="slurm")
    sbatch = Options(launcher="slurm", in_slurm_step=True)
    assert over_ssh(salloc, here) and over_ssh(salloc, there)  # srun starts every agent
    assert not over_ssh(sbatch, here) and over_ssh(sbatch, there)  # this node's: forked, in the batch step
