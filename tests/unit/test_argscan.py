"""The fast command-line scanner against click: same params and same 'given' set whenever the
scanner answers, and it answers for the command lines people type."""

from __future__ import annotations

import re

import pytest
from click.core import ParameterSource
from hypothesis import given, settings
from hypothesis import strategies as st

from mpilaunch.cli import cliopts
from mpilaunch.cli import tokens as argscan
from mpilaunch.cli.command import run_command
from mpilaunch.cli.parse import parse_args

SPELLINGS = [flag for opt in cliopts.all_rows() for flag in opt.flags]
VALUES = [
    "4",
    "0",
    "-1",
    "1.5",
    "0.0",
    "2.",
    ".5",
    "1e3",
    " 3",
    "1_0",
    "inf",
    "nan",
    "abc",
    "",
    "=",
    "--",
    "-",
    "all",
    "NONE",
    "Pmi2",
    "pmi1",
    "ppr:2:node",
    "a:2,b:2",
    "k",
    "-n",
    "x=y",
    "٣",
    "²",
    "pmi1\n",
    "ß",
    "３",
    "65536",
    "65537",
    "1024",
    "1025",
    "3600",
    "3601",
    "31536000",
    "31536001",
    "1e20",
    "99999999999",
    "99999999999999999999999",
]


def click_parse(words: list[str]) -> tuple[dict, set[str]] | None:
    import click

    try:
        ctx = run_command().make_context("mpilaunch", list(words))
    except (click.ClickException, click.exceptions.Exit):
        return None
    given_ = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    return ctx.params, given_


def word() -> st.SearchStrategy[str]:
    spelling = st.sampled_from(SPELLINGS)
    glued = st.builds(lambda s, v: f"{s}={v}", spelling, st.sampled_from(VALUES))
    return st.one_of(
        spelling, spelling, glued, st.sampled_from(VALUES), st.sampled_from(["prog", "-h", "-V", "-n4", "-x"])
    )


@settings(max_examples=2000, deadline=None)
@given(st.lists(word(), max_size=8))
def test_scanner_agrees_with_click(words: list[str]) -> None:
    scanned = argscan.scan(words)
    if scanned is None:
        return  # left to click, which answers for itself
    assert click_parse(words) == scanned, words


@pytest.mark.parametrize(
    "line",
    [
        "-n 8 python net.py",
        "-np 16 --hostfile hf --output-filename log --merge-stderr-to-stdout python net.py -n 5",
        "--np=4 -H a:2,b:2 -H c --mca btl tcp -mca x y --oversubscribe --map-by node prog",
        "-x A=1 -x B --bind-to core --tag-output --timeout 2.5 --kill-timeout 0 --mpi PMI2 prog",
        "--stdin all -wdir /tmp --devices-per-rank 2 --rank-table rt.json --ssh-accept-new -- -prog",
        "--allow-run-as-root --display-map --dry-run --report-bindings --timestamp-output --pmi-tcp prog",
        "--config job.yaml",
        "",
    ],
)
def test_scanner_takes_everyday_command_lines(line: str) -> None:
    """Without this, every run would quietly fall back to click and pay for it."""
    words = line.split()
    scanned = argscan.scan(words)
    assert scanned is not None
    assert scanned == click_parse(words)


@pytest.mark.parametrize("line", ["--help prog", "-V", "-n 0 prog", "--bogus prog", "-np", "-n4 prog", "--stdin x p"])
def test_scanner_leaves_help_version_and_errors_to_click(line: str) -> None:
    assert argscan.scan(line.split()) is None


def test_value_errors_are_in_plain_words_with_the_option_as_written() -> None:
    """`-np takes a whole number from 1 to 65,536, got '0'`, not click's `Invalid value for '-n' /
    '-np' / '--np' / '-c': 0 is not in the range 1<=x<=65536` (issue "The front door")."""
    from mpilaunch.errors import LaunchError

    with pytest.raises(LaunchError, match=r"^-np takes a whole number from 1 to 65,536, got '0'$"):
        parse_args(["-np", "0", "true"])
    with pytest.raises(LaunchError, match=r"^--stdin takes a rank number, all or none, got 'x'$"):
        parse_args(["--stdin", "x", "true"])
    with pytest.raises(LaunchError, match=r"^--mpi takes one of auto, pmi1, pmi2, pmix, none, got 'zz'$"):
        parse_args(["--mpi", "zz", "true"])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--timeout inf", "--timeout takes a number of seconds above 0, at most 31,536,000, got 'inf'"),
        ("--timeout 1e20", "--timeout takes a number of seconds above 0, at most 31,536,000, got '1e20'"),
        ("--timeout nan", "--timeout takes a number of seconds above 0, at most 31,536,000, got 'nan'"),
        ("--kill-timeout nan", "--kill-timeout takes a number of seconds from 0 to 3,600, got 'nan'"),
        ("--kill-timeout 3601", "--kill-timeout takes a number of seconds from 0 to 3,600, got '3601'"),
        ("-n 1000000000 --oversubscribe", "-n takes a whole number from 1 to 65,536, got '1000000000'"),
        ("-n 65537", "-n takes a whole number from 1 to 65,536, got '65537'"),
        (
            "--devices-per-rank 99999999999",
            "--devices-per-rank takes a whole number from 1 to 1,024, got '99999999999'",
        ),
        ("-n ３", "-n takes a whole number from 1 to 65,536, got '３'"),
        ("-n ٣", "-n takes a whole number from 1 to 65,536, got '٣'"),
        ("--timeout ３.５", "--timeout takes a number of seconds above 0, at most 31,536,000, got '３.５'"),
    ],
)
def test_numbers_are_finite_plain_and_in_range(line: str, message: str) -> None:
    """Each refused in one line (issue "No process left, ever", part 4): before, `inf` and `1e20`
    were tracebacks, `nan` no limit at all (and a busy loop), `-n 1000000000` gigabytes of memory,
    and `-n ３` three ranks. The fast scanner leaves each to click, which says why."""
    from mpilaunch.errors import LaunchError

    words = [*line.split(), "true"]
    assert argscan.scan(words) is None
    with pytest.raises(LaunchError, match=re.escape(message)):
        parse_args(words)


@pytest.mark.parametrize("value", ["inf", "nan", "1e20", "３", "abc"])
def test_mpiexec_timeout_is_checked_as_timeout_is(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from mpilaunch.errors import LaunchError

    monkeypatch.setenv("MPIEXEC_TIMEOUT", value)
    with pytest.raises(LaunchError, match=r"MPIEXEC_TIMEOUT=.* is not a number of seconds up to 31536000"):
        parse_args(["true"])


def test_the_ceiling_is_one_number() -> None:
    from mpilaunch.plan import placement

    assert cliopts.MAX_RANKS == placement.MAX_RANKS
