"""Hosts from the environment (MLP_MPI_*, Slurm, Grid Engine, PBS, LSF, Open MPI's default hostfile): parsers,
their order, MLP_MPI_NP; through the command (what --display-map says, bad values in one line) in
tests/local/test_dry_runs.py."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpilaunch.errors import LaunchError
from mpilaunch.plan.build import resolve_hosts
from mpilaunch.plan.hosts import Host
from mpilaunch.plan.hostsources import (
    expand_hostlist,
    expand_tasks_per_node,
    from_environment,
    mlp_np,
    parse_lsf_hosts,
    parse_mlp_hosts,
    parse_pbs_nodefile,
    slurm_hosts,
)
from mpilaunch.plan.spec import Options

# ---- Slurm hostlists ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("node1", ["node1"]),
        ("node1,node2", ["node1", "node2"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[01-04,07],gpu[1-2]", ["node01", "node02", "node03", "node04", "node07", "gpu1", "gpu2"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("n[007]", ["n007"]),
        ("n[1,3,5]", ["n1", "n3", "n5"]),
        ("n[5-5]", ["n5"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("a[1-2]b[3-4]c", ["a1b3c", "a1b4c", "a2b3c", "a2b4c"]),
        ("[1-2]x", ["1x", "2x"]),
        ("node-[1-2].cluster.local", ["node-1.cluster.local", "node-2.cluster.local"]),
        ("x,n[1-2],y", ["x", "n1", "n2", "y"]),
        ("  node[1-2]\n", ["node1", "node2"]),
        ("10.0.0.[1-3]", ["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
    ],
)
def test_hostlist_expansion(expr: str, names: list[str]) -> None:
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("", "no hosts"),
        ("node[1-2", "unclosed '['"),
        ("node1-2]", "']' without '['"),
        ("node[[1-2]]", "nested '['"),
        ("node[]", "empty '[]'"),
        ("node[3-1]", "range '3-1' goes down"),
        ("node[a-b]", "expected a number or a range"),
        ("node[1-2-3]", "expected a number or a range"),
        ("node[1,,2]", "expected a number or a range"),
        ("node[ 1]", "expected a number or a range"),
        ("node[١]", "expected a number or a range"),
        ("a,,b", "empty host name"),
        ("a,", "empty host name"),
        ("-oProxyCommand=x", "invalid host name"),
        ("node[1-2];id", "invalid host name"),
        ("n[0-99999999]", "more than 65536 hosts"),
        ("a[0-999]b[0-999]", "more than 65536 hosts"),
        pytest.param("n[" + "9" * 5000 + "]", "expected a number or a range", id="huge"),
    ],
)
def test_hostlist_errors_name_the_variable(expr: str, words: str) -> None:
    with pytest.raises(LaunchError) as info:
        expand_hostlist(expr)
    message = str(info.value)
    assert message.startswith("SLURM_JOB_NODELIST=")
    assert words in message
    assert "\n" not in message and len(message) < 300
    assert info.value.status == 2


_literal = st.from_regex(r"[a-z][a-z0-9.-]{0,5}", fullmatch=True)
_group = st.lists(
    st.tuples(st.integers(0, 120), st.integers(0, 6), st.integers(1, 4)),  # low, span, width
    min_size=1,
    max_size=3,
)


@given(st.lists(st.tuples(_literal, st.lists(st.tuples(_group, _literal), max_size=2)), min_size=1, max_size=4))
@settings(max_examples=300)
def test_hostlist_round_trip(items: list) -> None:
    """Build an expression from known parts, expand it, compare with the product of the parts."""
    texts, expected = [], []
    for head, groups in items:
        text, choices = head, [[head]]
        for ranges, tail in groups:
            pieces, numbers = [], []
            for low, span, width in ranges:
                high = low + span
                pieces.append(f"{low:0{width}d}" if span == 0 else f"{low:0{width}d}-{high:0{width}d}")
                numbers.extend(f"{n:0{width}d}" for n in range(low, high + 1))
            text += f"[{','.join(pieces)}]{tail}"
            choices += [numbers, [tail]]
        texts.append(text)
        expected.extend("".join(combo) for combo in itertools.product(*choices))
    assert expand_hostlist(",".join(texts)) == expected


def compress(names: list[str]) -> str:
    """What `scontrol show hostlist` would write for names prefix+number (consecutive runs)."""
    runs: list[list[int]] = []
    for number in sorted(int(n[4:]) for n in names):
        if runs and runs[-1][1] + 1 == number:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    body = ",".join(f"{a:02d}" if a == b else f"{a:02d}-{b:02d}" for a, b in runs)
    return f"node[{body}]"


@given(st.sets(st.integers(0, 99), min_size=1, max_size=40))
def test_hostlist_compressed_and_expanded_again(numbers: set[int]) -> None:
    names = [f"node{n:02d}" for n in sorted(numbers)]
    assert expand_hostlist(compress(names)) == names


@given(st.one_of(st.text(max_size=40), st.from_regex(r"[a-z0-9\[\]\-,]{0,24}", fullmatch=True)))
@settings(max_examples=500)
def test_fuzz_hostlist_only_raises_launch_errors(text: str) -> None:
    try:
        names = expand_hostlist(text)
    except LaunchError as exc:
        assert str(exc).startswith("SLURM_JOB_NODELIST=") and "\n" not in str(exc)
        return
    assert names and all(n and not n.startswith("-") and "[" not in n for n in names)


# ---- Slurm task counts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "counts"),
    [("1", [1]), ("2(x3),1", [2, 2, 2, 1]), ("4(x2)", [4, 4]), ("1,2,3", [1, 2, 3]), ("8(x1)", [8])],
)
def test_tasks_per_node(value: str, counts: list[int]) -> None:
    assert expand_tasks_per_node(value) == counts


@pytest.mark.parametrize(
    "value", ["", "x", "0", "2(x0)", "2(3)", "2(x3", "2x3", "2,,1", "-1", "2(x99999999)", "9" * 5000], ids=repr
)
def test_tasks_per_node_errors(value: str) -> None:
    with pytest.raises(LaunchError, match=r"^SLURM_TASKS_PER_NODE="):
        expand_tasks_per_node(value)


@given(st.lists(st.integers(1, 64), min_size=1, max_size=30))
def test_tasks_per_node_round_trip(counts: list[int]) -> None:
    text = ",".join(f"{c}(x{len(list(g))})" for c, g in itertools.groupby(counts))
    assert expand_tasks_per_node(text) == counts


@given(st.text(max_size=30))
@settings(max_examples=300)
def test_fuzz_tasks_per_node(text: str) -> None:
    try:
        counts = expand_tasks_per_node(text)
    except LaunchError as exc:
        assert "\n" not in str(exc)
        return
    assert counts and all(c >= 1 for c in counts)


def test_slurm_allocation() -> None:
    env = {"SLURM_JOB_NODELIST": "node[01-03],gpu1", "SLURM_TASKS_PER_NODE": "2(x3),1"}
    assert slurm_hosts(env) == [Host("node01", 2), Host("node02", 2), Host("node03", 2), Host("gpu1", 1)]
    # the older SLURM_NODELIST, the CPU counts when task counts are missing, else one slot each
    assert slurm_hosts({"SLURM_NODELIST": "n[1-2]", "SLURM_JOB_CPUS_PER_NODE": "4(x2)"}) == [
        Host("n1", 4),
        Host("n2", 4),
    ]
    assert slurm_hosts({"SLURM_JOB_NODELIST": "n[1-2]"}) == [Host("n1", 1), Host("n2", 1)]


def test_slurm_counts_must_match_the_nodes() -> None:
    with pytest.raises(LaunchError) as info:
        slurm_hosts({"SLURM_JOB_NODELIST": "n[1-4]", "SLURM_TASKS_PER_NODE": "2(x3)"})
    assert str(info.value) == "SLURM_TASKS_PER_NODE='2(x3)': 3 counts for the 4 nodes of SLURM_JOB_NODELIST"


# ---- MLP_MPI_HOSTS, LSF, PBS -----------------------------------------------------------------


def test_mlp_hosts() -> None:
    assert parse_mlp_hosts("worker0:2,worker1:2") == [Host("worker0", 2), Host("worker1", 2)]
    assert parse_mlp_hosts("worker0,worker0:3") == [Host("worker0", 4)]
    with pytest.raises(LaunchError, match=r"^MLP_MPI_HOSTS='w0:x': slots must be a whole number"):
        parse_mlp_hosts("w0:x")
    with pytest.raises(LaunchError, match=r"^MLP_MPI_HOSTS='a,,b': empty host name$"):
        parse_mlp_hosts("a,,b")


def test_mlp_np() -> None:
    assert mlp_np({}) is None
    assert mlp_np({"MLP_MPI_NP": " 16 "}) == 16
    for bad in ("0", "x", "-2", "1.5", "9" * 40):
        with pytest.raises(LaunchError, match=r"^MLP_MPI_NP="):
            mlp_np({"MLP_MPI_NP": bad})


def test_lsf_hosts() -> None:
    assert parse_lsf_hosts("host1 4 host2 4") == [Host("host1", 4), Host("host2", 4)]
    assert parse_lsf_hosts("h 1 h 2") == [Host("h", 3)]
    for bad, words in [("host1 4 host2", "pairs"), ("h x", "whole number"), ("-h 1", "invalid host name"), ("", "no")]:
        with pytest.raises(LaunchError, match=r"^LSB_MCPU_HOSTS=") as info:
            parse_lsf_hosts(bad)
        assert words in str(info.value)


def test_pbs_nodefile() -> None:
    text = "node1\nnode1\nnode2\n\nnode1\n"
    assert parse_pbs_nodefile(text, "nf") == [Host("node1", 3), Host("node2", 1)]
    with pytest.raises(LaunchError, match=r"^PBS_NODEFILE: nf:2: invalid host name '-x'$"):
        parse_pbs_nodefile("node1\n-x\n", "nf")
    with pytest.raises(LaunchError, match="no hosts"):
        parse_pbs_nodefile("\n\n", "nf")


# ---- order of the sources, and -H / --hostfile first --------------------------------------------


def test_sources_in_order(tmp_path: Path) -> None:
    hostfile = tmp_path / "mlp_hostfile"
    hostfile.write_text("172.22.128.95 slots=2\n172.22.128.94 slots=2\n")
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("p1\np1\n")
    ompi = tmp_path / "ompi_hosts"
    ompi.write_text("o1 slots=3\n")
    pe = tmp_path / "pe_hostfile"
    pe.write_text("g1 2 all.q@g1 UNDEFINED\n")
    env = {
        "MLP_MPI_HOSTFILE": str(hostfile),
        "MLP_MPI_HOSTS": "worker0:2,worker1:2",
        "SLURM_JOB_NODELIST": "s[1-2]",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "PE_HOSTFILE": str(pe),
        "PBS_NODEFILE": str(nodefile),
        "LSB_MCPU_HOSTS": "l1 2",
        "OMPI_MCA_orte_default_hostfile": str(ompi),
    }
    expected = [
        ([Host("172.22.128.95", 2), Host("172.22.128.94", 2)], f"MLP_MPI_HOSTFILE {hostfile}"),
        ([Host("worker0", 2), Host("worker1", 2)], "MLP_MPI_HOSTS"),
        ([Host("s1", 1), Host("s2", 1)], "Slurm allocation (SLURM_JOB_NODELIST)"),
        ([Host("g1", 2)], f"Grid Engine job's PE_HOSTFILE {pe}"),
        ([Host("p1", 2)], f"PBS_NODEFILE {nodefile}"),
        ([Host("l1", 2)], "LSB_MCPU_HOSTS"),
        ([Host("o1", 3)], f"OMPI_MCA_orte_default_hostfile {ompi}"),
    ]
    for name, want in zip([k for k in env if k != "SLURM_TASKS_PER_NODE"], expected):
        assert from_environment(env) == want
        assert resolve_hosts(Options(), env) == want
        del env[name]
        if name == "SLURM_JOB_NODELIST":
            del env["SLURM_TASKS_PER_NODE"]
    assert from_environment(env) is None
    assert from_environment({"MLP_MPI_HOSTS": "", "SLURM_JOB_NODELIST": ""}) is None  # empty counts as unset
    assert resolve_hosts(Options(), {})[1] == "localhost (no hosts given)"


def test_command_line_hosts_win_over_the_environment(tmp_path: Path) -> None:
    env = {"MLP_MPI_HOSTS": "worker0:2", "SLURM_JOB_NODELIST": "s1"}
    assert resolve_hosts(Options(hosts=("a:1",)), env) == ([Host("a", 1)], "-H")
    hostfile = tmp_path / "hf"
    hostfile.write_text("h slots=2\n")
    assert resolve_hosts(Options(hostfile=str(hostfile)), env) == ([Host("h", 2)], f"hostfile {hostfile}")


def test_file_sources_name_the_variable(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    for var in ("MLP_MPI_HOSTFILE", "PE_HOSTFILE", "PBS_NODEFILE", "OMPI_MCA_orte_default_hostfile"):
        with pytest.raises(LaunchError) as info:
            from_environment({var: missing})
        assert str(info.value).startswith(f"{var}: {missing}: cannot read")
    bad = tmp_path / "bad"
    bad.write_text("w0 slots=2\nw1 slots=two\n")
    with pytest.raises(LaunchError, match=rf"^MLP_MPI_HOSTFILE: {bad}:2: slots must be a whole number"):
        from_environment({"MLP_MPI_HOSTFILE": str(bad)})
    binary = tmp_path / "binary"
    binary.write_bytes(b"n1\n\xff\n")
    with pytest.raises(LaunchError, match=rf"^PBS_NODEFILE: {binary}:2: not UTF-8 text$"):
        from_environment({"PBS_NODEFILE": str(binary)})


class _Recording(dict):
    """An environment that records every variable asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key, default=None):  # type: ignore[no-untyped-def, override]
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        self.asked.add(key)
        return super().__getitem__(key)


def test_the_launcher_looks_for_every_variable_a_source_reads() -> None:
    """resolve_hosts imports hostsources only when one of ENVIRONMENT_SOURCES is set (a job
    without an allocation skips the module); a variable from_environment reads that is not in
    that list would be a source silently ignored."""
    from mpilaunch.plan.hosts import ENVIRONMENT_SOURCES

    env = _Recording()
    assert from_environment(env) is None
    assert env.asked == set(ENVIRONMENT_SOURCES)
    for name in ENVIRONMENT_SOURCES:  # and each one alone is used (or refused, naming it)
        try:
            _, source = resolve_hosts(Options(), {name: "node1"})
        except LaunchError as exc:
            assert name in str(exc)
        else:
            assert name in source
