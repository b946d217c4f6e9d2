"""What error lines echo is cut (issue "No process left, ever", part 6): a 5 MB host name or a
2 MB command line is never printed whole."""

from __future__ import annotations

import pytest

from mpilaunch.errors import LaunchError
from mpilaunch.host.programs import program_problem
from mpilaunch.launcher.report.report_text import COMMAND_SHOWN, shown_command
from mpilaunch.plan.hosts import parse_host_list, parse_hostfile, shown


def test_short_values_are_shown_as_repr_and_long_ones_cut_with_their_length() -> None:
    assert shown("node1") == "'node1'"
    long = "a" * 5_000_000
    text = shown(long)
    assert len(text) < 120 and text.endswith("(5000000 characters)")


def test_a_huge_host_name_is_cut_in_the_error_line() -> None:
    name = "a" * 5_000_000
    with pytest.raises(LaunchError) as caught:
        parse_host_list(name)
    assert len(str(caught.value)) < 300 and "5000000 characters" in str(caught.value)
    with pytest.raises(LaunchError) as caught:
        parse_hostfile(f"{name} slots=2\n", "hf")
    assert str(caught.value).startswith("hf:1: invalid host name") and len(str(caught.value)) < 300


def test_a_long_command_is_cut_a_short_one_kept() -> None:
    assert shown_command(["python", "t.py", "a b"]) == "python t.py 'a b'"
    text = shown_command(["python", "z" * 2_000_000])
    assert len(text) < COMMAND_SHOWN + 40 and text.endswith("(2000007 characters)")


def test_working_directory_problems_say_what_is_wrong(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plain = tmp_path / "file"
    plain.write_text("")
    assert program_problem("true", str(tmp_path / "none"), "/bin:/usr/bin", False) == (
        f"working directory {str(tmp_path / 'none')!r} does not exist"
    )
    assert program_problem("true", str(plain), "/bin:/usr/bin", False) == (
        f"working directory {str(plain)!r} is not a directory"
    )
    assert program_problem("true", str(tmp_path), "/bin:/usr/bin", False) is None
