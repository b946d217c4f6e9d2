"""Pure parts: option parsing, rank variables, the console multiplexer and the wire framing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpilaunch.cli.parse import parse_args
from mpilaunch.cli.tokens import split_apps
from mpilaunch.errors import LaunchError
from mpilaunch.launcher.output.sink import Console, rank_dir_name
from mpilaunch.launcher.report.report_text import ranges
from mpilaunch.plan.placement import Rank
from mpilaunch.plan.rank_env import JobLayout, inherited, job_variables, mask, rank_environment
from mpilaunch.protocol import wire


def test_single_dash_long_options_and_program_arguments() -> None:
    spec = parse_args(
        "-np 4 -hostfile hf -mca orte_abort_on_non_zero_status 0 -bind-to none -x A=1 -x B "
        "-wdir /tmp -npernode 2 --map-by=node python t.py -n 5 --lr 0.1".split()
    )
    (app,) = spec.apps
    assert app.argv == ("python", "t.py", "-n", "5", "--lr", "0.1")
    assert app.np == 4 and app.exports == (("A", "1"), ("B", None)) and app.wdir == "/tmp"
    opts = spec.options
    assert opts.hostfile == "hf" and opts.npernode == 2 and opts.map_by == "node"
    assert opts.abort_on_failure is False
    assert parse_args(["true"]).options.abort_on_failure is True


def test_mpmd_split_and_global_options_anywhere() -> None:
    assert split_apps(["-n", "1", "a", ":", "-n", "2", "b", "x"]) == [["-n", "1", "a"], ["-n", "2", "b", "x"]]
    spec = parse_args("-n 1 --tag-output a : -n 2 -H h:2 -mca k v b".split())
    assert [(a.np, a.argv) for a in spec.apps] == [(1, ("a",)), (2, ("b",))]
    assert spec.options.tag_output and spec.options.hosts == ("h:2",) and spec.options.mca == (("k", "v"),)


def test_map_by_oversubscribe_modifier_and_timeout_env(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_args(["--map-by", "node:OVERSUBSCRIBE", "true"])
    assert spec.options.map_by == "node" and spec.options.oversubscribe
    monkeypatch.setenv("MPIEXEC_TIMEOUT", "7")
    assert parse_args(["true"]).options.timeout == 7
    assert parse_args(["--timeout", "3", "true"]).options.timeout == 3
    monkeypatch.setenv("MPIEXEC_TIMEOUT", "soon")
    with pytest.raises(LaunchError, match="MPIEXEC_TIMEOUT"):
        parse_args(["true"])


def _layout(ranks: list[Rank]) -> JobLayout:
    return JobLayout(ranks, [len(ranks)], 8, "job1", "127.0.0.1", 29500, (("btl", "tcp"),))


def test_rank_variables_and_precedence() -> None:
    rank = Rank(rank=5, app=0, host=1, local_rank=1, local_size=4, node_rank=1)
    common = job_variables(_layout([rank] * 8), {"MASTER_PORT": "1234"})
    own = rank_environment(rank, (("DEVICE_ID", "3"), ("HOME", None)), {"HOME": "/h"})
    assert not own.keys() & (common.keys() - {"DEVICE_ID", "HOME"})  # the job's variables are not copied
    env = {**common, **own}  # as the agent sets them
    assert env["OMPI_COMM_WORLD_RANK"] == "5" and env["OMPI_COMM_WORLD_LOCAL_RANK"] == "1"
    assert env["OMPI_UNIVERSE_SIZE"] == "8" and env["OMPI_MCA_btl"] == "tcp"
    assert env["MASTER_PORT"] == "1234" and env["MASTER_ADDR"] == "127.0.0.1"
    assert env["DEVICE_ID"] == "3" and env["HOME"] == "/h"
    assert env["NODE_RANK"] == env["GROUP_RANK"] == "1" and env["LOCAL_WORLD_SIZE"] == "4"


def test_enclosing_launcher_variables_are_dropped() -> None:
    outer = {"PMI_FD": "3", "PMIX_RANK": "0", "OMPI_COMM_WORLD_RANK": "1", "OMPI_MCA_orte_hnp_uri": "x", "PATH": "/bin"}
    outer |= {"OMPI_MCA_btl": "tcp", "OMPI_ALLOW_RUN_AS_ROOT": "1"}
    assert inherited(outer) == {"PATH": "/bin", "OMPI_MCA_btl": "tcp", "OMPI_ALLOW_RUN_AS_ROOT": "1"}


def test_secret_values_are_masked() -> None:
    assert mask("HF_TOKEN", "x") == mask("AWS_SECRET_ACCESS_KEY", "x") == mask("DB_PASSWORD", "x") == "****"
    assert mask("RANK", "3") == "3"


def test_rank_dir_padding_follows_open_mpi() -> None:
    assert [rank_dir_name(r, 10) for r in (0, 9)] == ["rank.00", "rank.09"]
    assert rank_dir_name(3, 4) == "rank.3" and rank_dir_name(7, 100) == "rank.007"


def test_ranges() -> None:
    assert ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8" and ranges([]) == ""


class _Capture:
    """A console whose two streams are pipes we read back."""

    def __init__(self, tag: bool = False) -> None:
        self.r, w = os.pipe()
        self.console = Console(tag, False, {wire.STDOUT: w, wire.STDERR: w})
        self.w = w

    def text(self) -> str:
        return self.data().decode()

    def data(self) -> bytes:
        self.console.finish()
        assert self.console.writer.wait_drained(10.0)  # the console is written from a thread
        os.close(self.w)
        data = b""
        while chunk := os.read(self.r, 65536):
            data += chunk
        os.close(self.r)
        return data


def test_console_whole_lines_and_separated_partials() -> None:
    cap = _Capture()
    c = cap.console
    c.feed(0, wire.STDOUT, b"a1\na2-part", 0.0)
    c.feed(1, wire.STDOUT, b"b1-part", 0.0)
    c.feed(1, wire.STDOUT, b"-end\n", 0.1)
    c.flush_idle(1.0)  # a2-part shown after idling
    c.feed(1, wire.STDOUT, b"b2\n", 1.1)  # must start a new line
    c.feed(0, wire.STDOUT, b"-rest\n", 1.2)
    assert cap.text().splitlines() == ["a1", "b1-part-end", "a2-part", "b2", "-rest"]


def test_console_tags_continue_a_flushed_line_without_a_second_prefix() -> None:
    cap = _Capture(tag=True)
    c = cap.console
    c.feed(3, wire.STDERR, b"x", 0.0)
    c.flush_idle(1.0)
    c.feed(3, wire.STDERR, b"y\nz\n", 1.1)
    assert cap.text().splitlines() == ["[1,3]<stderr>:xy", "[1,3]<stderr>:z"]


@given(st.lists(st.tuples(st.integers(0, 3), st.binary(max_size=50)), max_size=30))
@settings(max_examples=200)
def test_fuzz_console_keeps_every_byte_of_every_rank(chunks: list[tuple[int, bytes]]) -> None:
    cap = _Capture()
    for i, (rank, data) in enumerate(chunks):
        cap.console.feed(rank, wire.STDOUT, data.replace(b"\n", b"") + b"\n", float(i))
    lines = cap.data().split(b"\n")[:-1]
    assert lines == [data.replace(b"\n", b"") for _, data in chunks]


@given(
    st.lists(
        st.one_of(
            st.binary(max_size=64),
            st.dictionaries(st.text(max_size=5).filter(lambda k: k != "op"), st.integers(), max_size=3),
        )
    )
)
@settings(max_examples=200)
def test_wire_round_trip_in_any_chunking(items: list) -> None:
    stream = b""
    for i, item in enumerate(items):
        stream += wire.output(i, wire.STDERR, item) if isinstance(item, bytes) else wire.control("x", **item)
    decoder = wire.Decoder()
    frames = []
    for start in range(0, len(stream), 7):
        frames += decoder.feed(stream[start : start + 7])
    assert len(frames) == len(items)
    for i, ((kind, value), item) in enumerate(zip(frames, items)):
        if isinstance(item, bytes):
            assert kind == wire.OUTPUT and value == (i, wire.STDERR, item)
        else:
            assert kind == wire.CONTROL and value == {"op": "x", **item}


@given(st.binary(max_size=200))
@settings(max_examples=300)
def test_fuzz_wire_decoder_rejects_garbage_cleanly(data: bytes) -> None:
    try:
        wire.Decoder().feed(data)
    except wire.FrameError:
        pass


@given(st.lists(st.binary(max_size=40), max_size=8), st.integers(0, 2**32 - 2), st.integers(1, 9))
@settings(max_examples=200)
def test_routed_frames_survive_two_relays_in_any_chunking(items: list, host: int, chunk: int) -> None:
    """What relays do: split whole frames off a child's stream without decoding them, wrap those
    not routed yet in the child's index, pass routed ones on as they are; the controller's
    decoder gets the host's frames back, each naming the host."""

    def relay(stream: bytes, child: int) -> bytes:
        buf, up = bytearray(), b""
        for start in range(0, len(stream), chunk):
            buf += stream[start : start + chunk]
            up += b"".join(f if kind == wire.ROUTED else wire.routed(child, f) for kind, f in wire.split(buf))
        assert not buf
        return up

    stream = b"".join(wire.output(i, wire.STDOUT, data) for i, data in enumerate(items))
    frames = wire.Decoder().feed(relay(relay(stream, host), 7))
    assert len(frames) == len(items)
    for i, (kind, (origin, inner)) in enumerate(frames):
        assert kind == wire.ROUTED and origin == host
        assert wire.decode_frame(inner) == (wire.OUTPUT, (i, wire.STDOUT, items[i]))


@given(st.binary(max_size=200))
@settings(max_examples=300)
def test_fuzz_relay_splitting_and_inner_frames_fail_cleanly(data: bytes) -> None:
    for step in (lambda: wire.split(bytearray(data)), lambda: wire.decode_frame(data)):
        try:
            step()
        except wire.FrameError:
            pass


def test_an_inner_frame_must_fill_its_routed_frame_exactly() -> None:
    frame = wire.control("ping")
    with pytest.raises(wire.FrameError, match="wrong length"):
        wire.decode_frame(frame + b"x")
    with pytest.raises(wire.FrameError, match="short"):
        wire.Decoder().feed(wire.routed(3, b""))


@given(st.integers(1, 300), st.integers(1, 12))
@settings(max_examples=200)
def test_tree_layout_is_breadth_first_with_at_most_width_children(hosts: int, width: int) -> None:
    from mpilaunch.transport.tree import path_up, tree_layout

    order = list(range(100, 100 + hosts))
    parents = tree_layout(order, width)
    assert [h for h in order if parents[h] is None] == order[:width]  # the launcher's own connections
    counts: dict[int, int] = {}
    for host in order:
        parent = parents[host]
        if parent is not None:
            assert order.index(parent) < order.index(host)  # a relay is started before its children
            counts[parent] = counts.get(parent, 0) + 1
    assert max(counts.values(), default=0) <= width
    levels, reach, total = 1, width, width  # hosts the tree holds within `levels` levels
    while total < hosts:
        reach *= width
        total += reach
        levels += 1
    assert max(len(path_up(parents, h)) for h in order) == levels  # as shallow as the width allows


def test_host_environment_takes_the_launchers_paths_that_exist(tmp_path: Path) -> None:
    from mpilaunch.host.programs import carried_environment, merge_host_environment

    here, gone = str(tmp_path), str(tmp_path / "gone")
    carried = carried_environment(
        {"PATH": f"{gone}:{here}:/usr/bin", "VIRTUAL_ENV": gone, "CONDA_PREFIX": here, "HOME": "/x"}
        | {"LD_LIBRARY_PATH": ""}
    )
    assert set(carried) == {"PATH", "VIRTUAL_ENV", "CONDA_PREFIX"}  # only what locates programs, never empty
    merged = merge_host_environment({"PATH": "/usr/bin:/bin", "HOME": "/root"}, carried)
    assert merged["PATH"] == f"{here}:/usr/bin:/bin"
    assert merged["CONDA_PREFIX"] == here and "VIRTUAL_ENV" not in merged and merged["HOME"] == "/root"
