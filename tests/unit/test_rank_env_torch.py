"""torchrun's variables (plan/rank_env.py): what job_variables and rank_variables give for
torchrun's fields, by hand and through the plan the launcher builds (parse_args, build_plan)."""

from __future__ import annotations

import os

import pytest

from mpilaunch.cli.parse import parse_args
from mpilaunch.errors import LaunchError
from mpilaunch.launcher.start.here import ThisMachine
from mpilaunch.plan.build import build_plan
from mpilaunch.plan.placement import Rank
from mpilaunch.plan.rank_env import JobLayout, job_variables, rank_environment, rank_variables

KNOBS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT"}


@pytest.fixture(autouse=True)
def _no_pet(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("PET_"):
            monkeypatch.delenv(name)


def node_ranks(count: int) -> list[Rank]:
    """One launcher's node: its ranks numbered from 0, as its own placement gives them."""
    return [Rank(rank=r, app=0, host=0, local_rank=r, local_size=count, node_rank=0) for r in range(count)]


def layout(ranks: list[Rank], **fields: object) -> JobLayout:
    return JobLayout(ranks, [len(ranks)], len(ranks), "job7", "n0", 29500, **fields)  # type: ignore[arg-type]


def test_a_node_of_torchruns_launcher_per_node_numbers_its_ranks_in_the_world() -> None:
    """Node 2 of 3, two ranks each: RANK from 4, the world's sizes, the node's rank."""
    ranks = node_ranks(2)
    job = layout(ranks, offset=4, world=6, node=2, nodes=3, torch=True, agent_store=True)
    common = job_variables(job, {})
    assert common["WORLD_SIZE"] == common["ROLE_WORLD_SIZE"] == common["OMPI_COMM_WORLD_SIZE"] == "6"
    assert common["PMI_SIZE"] == common["RANK_SIZE"] == "6"
    assert common["GROUP_WORLD_SIZE"] == "3" and common["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    envs = [rank_environment(r, (), {}, job) for r in ranks]
    assert [e["RANK"] for e in envs] == [e["ROLE_RANK"] for e in envs] == ["4", "5"]
    assert [e["OMPI_COMM_WORLD_RANK"] for e in envs] == [e["PMI_RANK"] for e in envs] == ["4", "5"]
    assert [e["LOCAL_RANK"] for e in envs] == [e["OMPI_COMM_WORLD_LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["GROUP_RANK"] for e in envs} == {e["NODE_RANK"] for e in envs} == {"2"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}


def test_without_a_launcher_per_node_the_ranks_are_the_job() -> None:
    ranks = [Rank(rank=r, app=0, host=r // 2, local_rank=r % 2, local_size=2, node_rank=r // 2) for r in range(6)]
    common = job_variables(layout(ranks, torch=True), {})
    assert common["WORLD_SIZE"] == "6" and common["GROUP_WORLD_SIZE"] == "3"  # the hosts of these ranks
    assert rank_variables(ranks[5])["RANK"] == "5" and rank_variables(ranks[5])["GROUP_RANK"] == "2"
    assert rank_variables(ranks[5], 10, 1)["RANK"] == "15" and rank_variables(ranks[5], 10, 1)["GROUP_RANK"] == "3"


def test_restart_count_max_restarts_role_and_run_id() -> None:
    ranks = node_ranks(1)
    common = job_variables(layout(ranks, attempt=3, max_restarts=5, role="trainer", run_id="rdzv9"), {})
    assert (common["TORCHELASTIC_RESTART_COUNT"], common["TORCHELASTIC_MAX_RESTARTS"]) == ("3", "5")
    assert (common["ROLE_NAME"], common["TORCHELASTIC_RUN_ID"]) == ("trainer", "rdzv9")
    common = job_variables(layout(ranks), {})
    assert common["TORCHELASTIC_RUN_ID"] == common["MPILAUNCH_JOB_ID"] == "job7"  # no --rdzv-id: the job's id
    assert common["TORCHELASTIC_RESTART_COUNT"] == "0" and common["ROLE_NAME"] == "default"
    assert common["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def test_torchruns_knobs_only_for_torchruns_command_line() -> None:
    ranks = node_ranks(1)
    assert KNOBS.items() <= job_variables(layout(ranks, torch=True), {}).items()
    assert not set(KNOBS) & set(job_variables(layout(ranks), {}))


def test_the_launchers_master_variables_win_only_under_mpiruns_words() -> None:
    ranks = node_ranks(1)
    launcher_env = {"MASTER_ADDR": "elsewhere", "MASTER_PORT": "12345", "PYTHONUNBUFFERED": "0"}
    common = job_variables(layout(ranks), launcher_env)
    assert (common["MASTER_ADDR"], common["MASTER_PORT"], common["PYTHONUNBUFFERED"]) == ("elsewhere", "12345", "0")
    for torch in ({}, {"offset": 1, "world": 2, "node": 1, "nodes": 2}):  # torchrun reads no MASTER_* of its own
        common = job_variables(layout(ranks, torch=True, **torch), launcher_env)
        assert (common["MASTER_ADDR"], common["MASTER_PORT"], common["PYTHONUNBUFFERED"]) == ("n0", "29500", "0")


# -- through the plan the launcher builds ------------------------------------------------------------
def plan_envs(words: list[str], env: dict[str, str] | None = None, attempt: int = 0) -> list[dict[str, str]]:
    plan, _ = build_plan(parse_args(words), {"PATH": os.defpath, **(env or {})}, ThisMachine(), attempt=attempt)
    return list(plan.job.rank_envs())


def test_node_one_of_two_through_the_plan() -> None:
    words = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", "29600"]
    words += ["--nproc-per-node", "2", "--max-restarts", "3", "--rdzv-id", "exp1", "--no-python", "true"]
    envs = plan_envs(words, {"MASTER_ADDR": "stale", "MASTER_PORT": "12345"}, attempt=2)
    assert [e["RANK"] for e in envs] == ["2", "3"] and [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    for env in envs:
        assert (env["WORLD_SIZE"], env["GROUP_WORLD_SIZE"], env["GROUP_RANK"], env["LOCAL_WORLD_SIZE"]) == (
            "4",
            "2",
            "1",
            "2",
        )
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29600")  # node 0's store, not stale
        assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("2", "3")
        assert env["TORCHELASTIC_RUN_ID"] == "exp1" and env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert KNOBS.items() <= env.items()


def test_one_launcher_with_torchruns_words_and_a_plain_job() -> None:
    envs = plan_envs(["--nproc-per-node", "2", "--no-python", "true"])
    assert [e["RANK"] for e in envs] == ["0", "1"] and {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["GROUP_WORLD_SIZE"] for e in envs} == {"1"} and {e["GROUP_RANK"] for e in envs} == {"0"}
    assert {e["TORCHELASTIC_RUN_ID"] for e in envs} == {envs[0]["MPILAUNCH_JOB_ID"]}
    assert KNOBS.items() <= envs[0].items() and envs[0]["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    plain = plan_envs(["-n", "2", "true"])
    assert not set(KNOBS) & set(plain[0]) and plain[0]["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert plain[1]["RANK"] == "1" and plain[1]["TORCHELASTIC_RESTART_COUNT"] == "0"


STALE = {"MASTER_ADDR": "stale", "MASTER_PORT": "12345"}


def test_torchruns_one_node_ignores_the_environments_master_and_takes_its_options() -> None:
    """As torchrun 2.13: the environment's MASTER_* are not read; --master-port (with --master-addr,
    else 127.0.0.1) is the ranks', also with --nnodes 1; --master-addr alone is not."""
    envs = plan_envs(["--nproc-per-node", "2", "--no-python", "true"], STALE)
    assert {e["MASTER_ADDR"] for e in envs} == {"localhost"} and {e["MASTER_PORT"] for e in envs} != {"12345"}
    given = (["--master-addr", "127.0.0.2", "--master-port", "29611"], ["--nnodes", "1", "--master-port", "29611"])
    for words in given:
        envs = plan_envs([*words, "--nproc-per-node", "2", "--no-python", "true"], STALE)
        addr = "127.0.0.2" if "--master-addr" in words else "127.0.0.1"
        assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {(addr, "29611")}
    envs = plan_envs(["--master-addr", "127.0.0.2", "--nproc-per-node", "1", "--no-python", "true"], STALE)
    assert envs[0]["MASTER_ADDR"] == "localhost" and envs[0]["MASTER_PORT"] != "12345"
    plain = plan_envs(["-n", "1", "true"], STALE)  # mpirun's words: the environment's win
    assert (plain[0]["MASTER_ADDR"], plain[0]["MASTER_PORT"]) == ("stale", "12345")


def test_every_nodes_launcher_gives_the_same_run_id_without_rdzv_id() -> None:
    """torchrun's `none`, not each launcher's own job id (which differs between nodes)."""
    for node in ("0", "1"):
        words = ["--nnodes", "2", "--node-rank", node, "--master-addr", "127.0.0.1", "--nproc-per-node", "1"]
        assert {e["TORCHELASTIC_RUN_ID"] for e in plan_envs([*words, "--no-python", "true"])} == {"none"}


def test_omp_num_threads_as_torchrun_sets_it() -> None:
    """torchrun: 1 with several ranks per node, unset for one, the environment's when it has one;
    mpirun's words: the host's CPUs shared by its ranks."""
    assert {e["OMP_NUM_THREADS"] for e in plan_envs(["--nproc-per-node", "2", "--no-python", "true"])} == {"1"}
    assert "OMP_NUM_THREADS" not in plan_envs(["--nproc-per-node", "1", "--no-python", "true"])[0]
    envs = plan_envs(["--nproc-per-node", "2", "--no-python", "true"], {"OMP_NUM_THREADS": "3"})
    assert {e["OMP_NUM_THREADS"] for e in envs} == {"3"}
    assert plan_envs(["-n", "1", "true"])[0]["OMP_NUM_THREADS"] == str(len(os.sched_getaffinity(0)))


@pytest.mark.parametrize(
    "hosts",
    [
        "-H node1,node2",
        "-H node1:1,node2:1",
        "hostfile slots=1",
        "hostfile slots=4",
        "-hosts node1,node2",
        "-ppn 1 -hosts node1:1,node2:1,node1",
    ],
)
def test_torchruns_words_put_nproc_per_node_on_every_host_whatever_its_slots(tmp_path, hosts: str) -> None:  # type: ignore[no-untyped-def]
    """torchrun has no slots: `-H node1,node2 --nproc-per-node 2` (one slot each, as Open MPI
    reads -H) is 2 ranks on each host, as a hostfile whose lines say fewer or more slots, and
    hydra's host list, each host once, whatever its counts and -ppn say."""
    if hosts.startswith("hostfile"):
        (tmp_path / "hosts").write_text("".join(f"{name} {hosts.split()[1]}\n" for name in ("node1", "node2")))
        words = ["--hostfile", str(tmp_path / "hosts")]
    else:
        words = hosts.split()
    plan, _ = build_plan(parse_args([*words, "--nproc-per-node", "2", "train.py"]), {"PATH": os.defpath}, ThisMachine())
    placed = [(plan.hosts[r.host].name, r.rank, r.local_rank) for r in plan.job.ranks]
    assert placed == [("node1", 0, 0), ("node1", 1, 1), ("node2", 2, 0), ("node2", 3, 1)]
    envs = list(plan.job.rank_envs())
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["WORLD_SIZE"], e["GROUP_RANK"]) for e in envs] == [
        ("0", "0", "2", "4", "0"),
        ("1", "1", "2", "4", "0"),
        ("2", "0", "2", "4", "1"),
        ("3", "1", "2", "4", "1"),
    ]


ALLOCATION = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_CPUS_PER_NODE": "1(x2)"}


@pytest.mark.parametrize(
    "words, env",
    [
        ("-H node1,node2 --nnodes 2", {}),
        ("-H node1,node2 --nnodes 1:4 --rdzv-backend c10d", {}),
        ("--nnodes 2", ALLOCATION),
    ],
)
def test_nnodes_with_the_hosts_of_one_launcher_is_their_count(words: str, env: dict[str, str]) -> None:
    """torchrun's --nnodes with hosts and nowhere to meet: one mpilaunch for the job, whose
    hosts are torchrun's nodes (before: refused, as if each node had a launcher of its own)."""
    line = [*words.split(), "--nproc-per-node", "2", "train.py"]
    for name in ("mpilaunch", "torchrun"):
        plan, _ = build_plan(parse_args(line, name), {"PATH": os.defpath, **env}, ThisMachine())
        placed = [(plan.hosts[r.host].name, r.local_rank) for r in plan.job.ranks]
        assert placed == [("node1", 0), ("node1", 1), ("node2", 0), ("node2", 1)], name


@pytest.mark.parametrize(
    "words, env, says",
    [
        ("-H node1,node2 --nnodes 3", {}, "--nnodes 3 with 2 hosts from -H: one mpilaunch starts the ranks of all"),
        ("-H node1,node2 --nnodes 1", {}, "--nnodes 1 with 2 hosts from -H:"),
        ("-H node1,node2 --standalone", {}, "--standalone with 2 hosts from -H:"),
        ("--nnodes 2:4", {}, "--nnodes 2:4: no hosts given, so this machine alone; give -H or a hostfile with 2"),
        ("-H node1,node2 --nnodes 2 --node-rank 0 --master-addr h", {}, "-H or a hostfile with torchrun's launcher"),
    ],
)
def test_nnodes_that_the_hosts_contradict_is_refused_in_one_line(words: str, env: dict[str, str], says: str) -> None:
    """A count of nodes the hosts do not have would start a job of another size than asked
    (before: `--nnodes 1` with two hosts ran on both, and -H was dropped with a launcher per node)."""
    with pytest.raises(LaunchError) as caught:
        spec = parse_args([*words.split(), "--nproc-per-node", "2", "train.py"])
        build_plan(spec, {"PATH": os.defpath, **env}, ThisMachine())
    assert str(caught.value).startswith(says) and "\n" not in str(caught.value), caught.value
    assert caught.value.status == 2


@pytest.mark.parametrize(
    "words, nodelist, placed",
    [
        ("--nnodes 1", "node1,{me}", ["{me}", "{me}"]),
        ("--standalone", "node1,{me}", ["{me}", "{me}"]),
        ("--nnodes 2", "node1,{me},node3", ["{me}", "{me}", "node1", "node1"]),
    ],
)
def test_nnodes_in_a_larger_allocation_takes_this_machine_first(words: str, nodelist: str, placed: list[str]) -> None:
    """torchrun --nnodes 1 in a batch script runs on the batch host: an allocation of more hosts
    lends --nnodes of them, this machine first (before: refused as a contradiction)."""
    me = os.uname().nodename
    env = {
        **ALLOCATION,
        "SLURM_JOB_NODELIST": nodelist.format(me=me),
        "SLURM_JOB_CPUS_PER_NODE": f"1(x{nodelist.count(',') + 1})",
    }
    line = [*words.split(), "--nproc-per-node", "2", "train.py"]
    plan, _ = build_plan(parse_args(line), {"PATH": os.defpath, **env}, ThisMachine())
    assert [plan.hosts[r.host].name for r in plan.job.ranks] == [name.format(me=me) for name in placed]


@pytest.mark.parametrize("words, ranks", [("-genv A 1 --nproc-per-node 3", 3), ("-ppn 3 --nproc-per-node 2", 2)])
def test_torchruns_ranks_per_node_on_this_machine_with_hydras_words(words: str, ranks: int) -> None:
    """hydra's words beside torchrun's on this machine: --nproc-per-node ranks, not hydra's one
    rank for a host list of none, nor -ppn's count (torchrun's gives way to none, as over -N)."""
    plan, _ = build_plan(parse_args([*words.split(), "train.py"]), {"PATH": os.defpath}, ThisMachine())
    assert [(r.rank, r.local_rank) for r in plan.job.ranks] == [(r, r) for r in range(ranks)]
