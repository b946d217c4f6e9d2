"""Why a rank failed (launcher/report/root_cause.py), read from inputs made here: error files,
tracebacks Python formats in this process. Those made by running torch's `@record` and scripts
that do not compile: tests/local/test_root_cause_inputs.py."""

from __future__ import annotations

import json
import traceback

import pytest

from mpilaunch.launcher.report.root_cause import RootCause, from_error_file, from_traceback, root_cause


def formatted(raise_it: object) -> list[str]:
    """The lines Python prints for what raise_it() raises."""
    try:
        raise_it()  # type: ignore[operator]
    except BaseException:  # KeyboardInterrupt too: it is one of the cases
        return traceback.format_exc().splitlines()
    raise AssertionError("nothing raised")


def frame_of(cause: RootCause, index: int) -> str:
    return cause.frames[index].splitlines()[0]


# -- the error file ----------------------------------------------------------------------------------


def test_a_plain_message_file() -> None:
    cause = from_error_file(json.dumps({"message": "RuntimeError: NCCL timeout: rank 3"}), "/x/error.json")
    assert cause == RootCause("RuntimeError", "NCCL timeout: rank 3", (), "the error file /x/error.json")
    cause = from_error_file('{"message": "KeyboardInterrupt"}', "")
    assert cause == RootCause("KeyboardInterrupt", "", (), "its TORCHELASTIC_ERROR_FILE")
    assert cause.line == "KeyboardInterrupt"


def test_a_message_with_a_callstack_that_has_no_traceback_keeps_the_message() -> None:
    text = json.dumps({"message": {"message": "OSError: disk full", "extraInfo": {"py_callstack": "gone"}}})
    assert from_error_file(text, "e.json") == RootCause("OSError", "disk full", (), "the error file e.json")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        '{"message": ',  # cut short
        "[1, 2]",
        '{"message": 5}',
        '{"other": "ValueError: x"}',
        '{"message": {"extraInfo": "not a mapping"}}',
        '{"message": {"message": "", "extraInfo": {"py_callstack": 7}}}',
        pytest.param("[" * 100_000, id="deeper-than-json-reads"),
        pytest.param('{"message": ' * 100_000, id="deep-messages"),
    ],
)
def test_garbage_in_the_error_file_is_no_cause(text: str) -> None:
    """The rank may write anything there (up to a MiB): never a traceback in the launcher."""
    assert from_error_file(text, "e.json") is None
    assert root_cause(text, "e.json", []) is None


# -- tracebacks on stderr -------------------------------------------------------------------------------
def _during_handling() -> None:
    try:
        {}["shard"]
    except KeyError:
        raise RuntimeError("cleanup failed")  # noqa: B904 (chained implicitly: the case under test)


def test_during_handling_the_last_exception_is_the_cause() -> None:
    lines = formatted(_during_handling)
    assert "During handling of the above exception, another exception occurred:" in lines
    cause = from_traceback(lines)
    assert cause is not None and (cause.kind, cause.message) == ("RuntimeError", "cleanup failed")
    assert frame_of(cause, 0).endswith("in _during_handling") and "RuntimeError" in cause.frames[0]
    assert not any("KeyError" in frame for frame in cause.frames)


def test_a_traceback_followed_by_other_output() -> None:
    lines = formatted(lambda: [][3])
    lines += ["[rank1]:[W1126 10:00:00] ProcessGroupGloo: destroyed", "Epoch 3: loss 0.25", "Done", "INFO:root:bye"]
    cause = from_traceback(lines)
    assert cause is not None and (cause.kind, cause.message) == ("IndexError", "list index out of range")


def test_keyboard_interrupt_has_no_message() -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    cause = from_traceback(formatted(interrupted))
    assert cause is not None and (cause.kind, cause.message) == ("KeyboardInterrupt", "")
    assert cause.line == "KeyboardInterrupt"
    assert frame_of(cause, 0).endswith("in interrupted")


def test_an_exception_of_a_dotted_module() -> None:
    cause = from_traceback(formatted(lambda: json.loads("{")))
    assert cause is not None and cause.kind == "json.decoder.JSONDecodeError"
    assert cause.message == "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    assert "json" in frame_of(cause, 0) and "decoder.py" in frame_of(cause, 0)


def test_a_multi_line_message_gives_its_first_line() -> None:
    cause = from_traceback(formatted(lambda: (_ for _ in ()).throw(ValueError("first\nsecond"))))
    assert cause is not None and (cause.kind, cause.message) == ("ValueError", "first")


@pytest.mark.parametrize(
    "lines",
    [
        [],
        ["loss 0.3", "ValueError: said by the program, not raised"],
        ["Traceback (most recent call last):", '  File "t.py", line 3, in <module>'],  # cut off
        ["SyntaxError: a line alone, no file above it"],
    ],
)
def test_no_traceback_is_no_cause(lines: list[str]) -> None:
    assert from_traceback(lines) is None
    assert root_cause("", "", lines) is None
