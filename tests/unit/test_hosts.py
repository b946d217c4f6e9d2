"""Hostfile and -H parsing: grammar, errors with file and line, and fuzzing (through the command:
tests/local/test_dry_runs.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpilaunch.errors import LaunchError
from mpilaunch.plan.hosts import Host, merge_consecutive, parse_host_list, parse_hostfile


def test_openmpi_grammar_with_comments_and_blank_lines() -> None:
    text = "# cluster\n\nnode1 slots=8 max_slots=16\nnode2 slots=4   # a comment\n192.168.0.1 slots=8\n"
    assert parse_hostfile(text, "hf") == [
        Host("node1", 8, 16),
        Host("node2", 4),
        Host("192.168.0.1", 8),
    ]


def test_mpich_count_user_and_port_forms() -> None:
    text = "alice@node1:4\nnode2:2 port=2222\nnode3 user=bob slots=1\n[::1]:3\n"
    assert parse_hostfile(text, "hf") == [
        Host("node1", 4, None, "alice"),
        Host("node2", 2, None, None, 2222),
        Host("node3", 1, None, "bob"),
        Host("[::1]", 3),
    ]


def test_spaces_around_the_equals_sign_as_open_mpi_reads_them() -> None:
    assert parse_hostfile("a slots = 2\nb slots= 3 max_slots =4\n", "hf") == [Host("a", 2), Host("b", 3, 4)]


def test_missing_slots_means_core_count_later() -> None:
    assert parse_hostfile("node1\n", "hf") == [Host("node1", None)]


def test_open_mpi_slot_rules_for_bare_and_max_only_lines() -> None:
    assert parse_hostfile("a\na\na\nb\n", "hf") == [Host("a", 3), Host("b", None)]
    assert parse_hostfile("a max_slots=3\n", "hf") == [Host("a", 3, 3)]


def test_repeated_host_adds_slots() -> None:
    assert parse_hostfile("a slots=2\nb slots=1\na slots=3\n", "hf") == [Host("a", 5), Host("b", 1)]
    assert parse_host_list("a,a,b:2") == [Host("a", 1), Host("a", 1), Host("b", 2)]


def test_hydra_merges_a_host_repeating_the_entry_before_it_only() -> None:
    merged = merge_consecutive(parse_host_list("a,a,b:2,b,a,c@a"))
    shown = [(h.name, h.slots, h.user) for h in merged]
    assert shown == [("a", 2, None), ("b", 3, None), ("a", 1, None), ("a", 1, "c")]


def test_host_list_default_one_slot() -> None:
    assert parse_host_list("a:2,b") == [Host("a", 2), Host("b", 1)]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("good slots=2\nbad slots=x\n", 2, "slots must be a whole number"),
        ("a slots=2\n\n-evil slots=1\n", 3, "invalid host name"),
        ("a slots=0\n", 1, "at least 1"),
        ("a slots=4 max_slots=2\n", 1, "less than slots"),
        ("a colour=blue\n", 1, "unknown key"),
        ("a slots\n", 1, "expected key=value"),
        ("a;rm -rf /\n", 1, "invalid host name"),
        ("-o@host\n", 1, "invalid user name"),
        ("a port=70000\n", 1, "out of range"),
    ],
)
def test_errors_name_file_and_line(text: str, line: int, words: str) -> None:
    with pytest.raises(LaunchError) as info:
        parse_hostfile(text, "my_hosts")
    message = str(info.value)
    assert message.startswith(f"my_hosts:{line}: ")
    assert words in message
    assert info.value.status == 2


def test_empty_hostfile_is_an_error() -> None:
    with pytest.raises(LaunchError, match="no hosts"):
        parse_hostfile("# nothing\n\n", "hf")


@pytest.mark.parametrize("value", ["", "a,,b", "a:x", "-a", "a:0", "a b", "$(id)", "a:" + "9" * 5000], ids=str.__len__)
def test_bad_host_lists(value: str) -> None:
    with pytest.raises(LaunchError):
        parse_host_list(value)


_lines = st.lists(
    st.one_of(
        st.text(max_size=40),
        st.from_regex(
            r"[a-z0-9.@\-\[\]:]{1,12}( (slots|max_slots|port|user|cpu)=[0-9a-z\-]{0,4}){0,3}", fullmatch=True
        ),
    ),
    max_size=8,
)


@given(_lines)
@settings(max_examples=400)
def test_fuzz_hostfile_parser_only_raises_launch_errors(lines: list[str]) -> None:
    text = "\n".join(lines)
    try:
        hosts = parse_hostfile(text, "fuzz")
    except LaunchError as exc:
        assert "\n" not in str(exc)
        assert str(exc).startswith("fuzz")
        return
    assert hosts
    for host in hosts:
        assert not host.name.startswith("-")
        assert host.slots is None or host.slots >= 1


@given(st.text(max_size=60))
@settings(max_examples=400)
def test_fuzz_host_list_only_raises_launch_errors(value: str) -> None:
    try:
        hosts = parse_host_list(value)
    except LaunchError as exc:
        assert "\n" not in str(exc)
        return
    assert all(h.slots and h.slots >= 1 and not h.name.startswith("-") for h in hosts)
