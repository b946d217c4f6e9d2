"""Placement: every rank's host and OMPI_COMM_WORLD_* values equal Open MPI 4.1's mpirun.

tests/data/openmpi41_truth.json was recorded from Debian's openmpi-bin 4.1 by
tests/data/openmpi41_truth.py (run it again to re-check); test_live_openmpi compares a
few scenarios against the real mpirun when it is installed.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpilaunch.cli.parse import parse_args
from mpilaunch.errors import LaunchError
from mpilaunch.launcher.start.here import ThisMachine
from mpilaunch.plan.build import build_plan
from mpilaunch.plan.hosts import Host, merge_hosts, parse_host_list, parse_hostfile, with_core_counts
from mpilaunch.plan.placement import place
from mpilaunch.plan.spec import AppContext, JobSpec, Options
from tests.conftest import ROOT

TRUTH = json.loads((ROOT / "tests" / "data" / "openmpi41_truth.json").read_text())
# Where mpilaunch deliberately differs from Open MPI 4.1 (see docs/reference.md):
DELIBERATE = {
    # SPEC: a repeated hostfile host adds its slots; Open MPI 4.1 refuses the hostfile.
    "hf_repeat_a2_a2_b2": "adds up",
    "hf_repeat_a2_a2_b2_np5": "adds up",
}


def _hosts(scenario: dict) -> list[Host]:
    """The scenario's hosts through our own parsers; no slots left means the host's cores."""
    if scenario["hostspec"] == "H":
        words = [name if slots is None else f"{name}:{slots}" for name, slots, _ in scenario["hosts"]]
        hosts = merge_hosts(parse_host_list(",".join(words)))
    else:
        lines = [
            " ".join([name] + ([f"slots={slots}"] if slots else []) + ([f"max_slots={mx}"] if mx else []))
            for name, slots, mx in scenario["hosts"]
        ]
        hosts = parse_hostfile("\n".join(lines), "hostfile")
    return with_core_counts(hosts, {h.name: TRUTH["hnp_cores"] for h in hosts})


def _options(args: list[str]) -> tuple[dict, int | None]:
    """The scenario's mpirun options as mpilaunch's own parser reads them (cli/parse.py)."""
    options = parse_args([*args, "prog"], "mpirun").options
    np = None
    if "-np" in args:
        np = int(args[args.index("-np") + 1])
    opts = {
        "map_by": options.map_by,
        "npernode": options.npernode,
        "oversubscribe": options.oversubscribe,
        "rank_by": options.rank_by,
    }
    return opts, np


@pytest.mark.parametrize("scenario", TRUTH["scenarios"], ids=lambda s: s["name"])
def test_matches_open_mpi(scenario: dict) -> None:
    if scenario["name"] in DELIBERATE:
        pytest.skip(DELIBERATE[scenario["name"]])
    hosts = _hosts(scenario)
    opts, np = _options(scenario["args"])
    apps = [(n, "prog") for n in scenario["apps"]] if scenario["apps"] else [(np, "prog")]
    exceeds_max = scenario["returncode"] == 0 and any(
        h.max_slots is not None and sum(1 for r in scenario["ranks"] if r["host"] == h.name) > h.max_slots
        for h in hosts
    )
    if scenario["returncode"] != 0:
        with pytest.raises(LaunchError, match="not enough slots"):
            place(hosts, apps, **opts)
        return
    if exceeds_max:
        # Open MPI 4.1 ignores max_slots; SPEC makes it a hard cap: the rest go elsewhere, or it fails.
        try:
            ranks = place(hosts, apps, **opts)
        except LaunchError as exc:
            assert "max_slots" in str(exc)
            return
        for index, host in enumerate(hosts):
            assert host.max_slots is None or sum(1 for r in ranks if r.host == index) <= host.max_slots
        assert len(ranks) == len(scenario["ranks"])
        return
    ranks = place(hosts, apps, **opts)
    ours = [
        {
            "rank": r.rank,
            "host": hosts[r.host].name,
            "OMPI_COMM_WORLD_LOCAL_RANK": str(r.local_rank),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(r.local_size),
            "OMPI_COMM_WORLD_NODE_RANK": str(r.local_rank),
            "OMPI_MCA_orte_app_num": str(r.app),
        }
        for r in ranks
    ]
    theirs = [{k: rec[k] for k in ours[0]} for rec in scenario["ranks"]]
    assert ours == theirs
    sizes = {rec["OMPI_COMM_WORLD_SIZE"] for rec in scenario["ranks"]}
    assert sizes == {str(len(ranks))}
    universe = {int(rec["OMPI_UNIVERSE_SIZE"]) - TRUTH["hnp_cores"] for rec in scenario["ranks"]}
    assert universe == {sum(h.slots or 0 for h in hosts)}


def test_environment_of_a_planned_job_matches_open_mpi() -> None:
    """The same through build_plan, including app-context variables, for an MPMD job."""
    scenario = next(s for s in TRUTH["scenarios"] if s["name"] == "mpmd_1_2_3_bynode_a2b2c2d2")
    spec = JobSpec(
        apps=tuple(AppContext(("prog",), np=n) for n in scenario["apps"]),
        options=Options(hosts=("a:2,b:2,c:2,d:2",), map_by="node"),
    )
    plan, _ = build_plan(spec, {}, ThisMachine())
    for env, rec in zip(plan.job.rank_envs(), scenario["ranks"]):
        for key in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK", "OMPI_NUM_APP_CTX",
                    "OMPI_APP_CTX_NUM_PROCS", "OMPI_MCA_orte_app_num"):  # fmt: skip
            assert env[key] == rec[key], key
        # Open MPI 4.1 writes every first rank as 0 (a defect); we give the real ones.
        assert env["OMPI_FIRST_RANKS"] == "0 1 3"


def test_max_slots_is_a_hard_cap_and_others_take_the_rest() -> None:
    hosts = [Host("a", 2, 3), Host("b", 2)]
    ranks = place(hosts, [(8, "p")], oversubscribe=True)
    assert [hosts[r.host].name for r in ranks].count("a") == 3
    with pytest.raises(LaunchError, match="max_slots"):
        place([Host("a", 2, 3)], [(4, "p")], oversubscribe=True)


def test_not_enough_slots_message_names_the_slots() -> None:
    with pytest.raises(LaunchError) as info:
        place([Host("a", 2), Host("b", 1)], [(4, "python")])
    text = str(info.value)
    assert "There are not enough slots available in the system to satisfy the 4 slots" in text
    assert "a:2, b:1" in text and "--oversubscribe" in text


@given(
    slots=st.lists(st.integers(1, 5), min_size=1, max_size=5),
    nps=st.lists(st.integers(1, 12), min_size=1, max_size=3),
    policy=st.sampled_from(["slot", "node", "ppr:1:node", "ppr:2:node"]),
    over=st.booleans(),
)
@settings(max_examples=300)
def test_placement_invariants(slots: list[int], nps: list[int], policy: str, over: bool) -> None:
    hosts = [Host(f"h{i}", s) for i, s in enumerate(slots)]
    try:
        ranks = place(hosts, [(n, "p") for n in nps], policy, None, over)
    except LaunchError:
        return
    assert [r.rank for r in ranks] == list(range(len(ranks)))
    if not policy.startswith("ppr"):
        assert len(ranks) == sum(nps)
    per_host: dict[int, list] = {}
    for r in ranks:
        per_host.setdefault(r.host, []).append(r)
    for host, mine in per_host.items():
        assert [r.local_rank for r in mine] == list(range(len(mine)))
        assert {r.local_size for r in mine} == {len(mine)}
        if not over:
            assert len(mine) <= hosts[host].slots
    assert sorted({r.node_rank for r in ranks}) == list(range(len(per_host)))


@pytest.mark.parametrize(
    ("hosts", "apps", "policy"),
    [
        ([Host("a", slots=1_000_000), Host("b", slots=1_000_000)], [(None, "p")], "slot"),  # every slot
        ([Host("a", slots=4)], [(40_000, "p"), (40_000, "q")], "slot"),  # two app contexts together
        ([Host(f"h{i}", slots=1) for i in range(70)], [(None, "p")], "ppr:1000:node"),
    ],
)
def test_a_job_beyond_the_ceiling_is_refused_before_it_is_planned(
    hosts: list[Host], apps: list[tuple[int | None, str]], policy: str
) -> None:
    """Refused before a rank is placed, naming the count and the ceiling (it used to take
    gigabytes and minutes)."""
    with pytest.raises(LaunchError, match=r"the job would have \d+ ranks; mpilaunch starts at most 65536"):
        place(hosts, apps, map_by=policy, oversubscribe=True)


def test_a_spawned_apps_hosts_hold_it_to_them() -> None:
    """MPI_Comm_spawn's info host: an app's ranks only on the hosts it names (in_use counted),
    the others' as before; with -n left out, as many as those hosts have free."""
    hosts = [Host("a", 2), Host("b", 2), Host("c", 2)]
    ranks = place(hosts, [(3, "x"), (1, "y")], in_use=[1, 0, 0], only=[{1, 2}, None])
    assert [(r.app, r.host) for r in ranks] == [(0, 1), (0, 1), (0, 2), (1, 0)]
    ranks = place(hosts, [(None, "x")], in_use=[0, 1, 0], only=[{1}])
    assert [r.host for r in ranks] == [1]
    with pytest.raises(LaunchError, match="not enough slots"):
        place(hosts, [(3, "x")], only=[{0}])
    assert [r.host for r in place(hosts, [(3, "x")], oversubscribe=True, only=[{0}])] == [0, 0, 0]


def test_spawn_info_names_hosts_of_the_job_only() -> None:
    from mpilaunch.plan.build import spawn_hosts

    hosts = [Host("node1", 2), Host("node2", 2)]
    assert spawn_hosts({}, hosts) is None
    assert spawn_hosts({"wdir": "/tmp"}, hosts) is None
    assert spawn_hosts({"host": "node2"}, hosts) == {1}
    assert spawn_hosts({"host": "node2:4, node1"}, hosts) == {0, 1}
    assert spawn_hosts({"hosts": "node1"}, hosts) == {0}
    with pytest.raises(LaunchError) as refused:
        spawn_hosts({"host": "node3"}, hosts)
    assert str(refused.value) == "its info names host 'node3', not one of the job's hosts (node1, node2)"
    with pytest.raises(LaunchError):  # this machine is none of these two
        spawn_hosts({"host": "localhost"}, hosts)
    here = [Host("node1", 2), Host("localhost", 2)]
    for name in ("localhost", "127.0.0.1", os.uname().nodename):  # this machine, by any of its names
        assert spawn_hosts({"host": name}, here) == {1}, name
