"""Why a rank failed (launcher/report/root_cause.py), read from real inputs: an error file torch 2.13's
`@record` writes, made for real at the start of this module (a script run once with
TORCHELASTIC_ERROR_FILE set, in a subprocess: torch's import takes a few seconds), the same
run's stderr, tracebacks Python formats here, and a script that does not compile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import pytest

from mpilaunch.launcher.report.root_cause import RootCause, from_error_file, from_traceback, root_cause

TRAIN = textwrap.dedent(
    """\
    from torch.distributed.elastic.multiprocessing.errors import record

    SHARDS = {}

    def lookup(n):
        return SHARDS[n]

    def load(n):
        try:
            lookup(n)
        except KeyError as exc:
            raise ValueError(f"bad shard {n}") from exc

    @record
    def main():
        load(7)

    main()
    """
)


class Recorded:
    """A failed run of TRAIN: its error file's path and text, and its stderr's lines."""

    def __init__(self, tmp: Path) -> None:
        script = tmp / "train.py"
        script.write_text(TRAIN)
        self.script = str(script)
        self.path = str(tmp / "error.json")
        env = {**os.environ, "TORCHELASTIC_ERROR_FILE": self.path}
        proc = subprocess.run([sys.executable, self.script], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stderr
        self.text = Path(self.path).read_text()
        self.stderr = proc.stderr.splitlines()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return Recorded(tmp_path_factory.mktemp("record"))


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
def test_records_error_file_is_the_exception_its_message_and_its_frames_innermost_first(
    recorded: Recorded,
) -> None:
    document = json.loads(recorded.text)  # torch's layout, as this version writes it
    assert document["message"]["message"] == "ValueError: bad shard 7"
    assert "The above exception was the direct cause" in document["message"]["extraInfo"]["py_callstack"]
    cause = from_error_file(recorded.text, recorded.path)
    assert cause is not None
    assert (cause.kind, cause.message, cause.line) == ("ValueError", "bad shard 7", "ValueError: bad shard 7")
    assert cause.source == f"the error file {recorded.path}"
    assert frame_of(cause, 0) == f'File "{recorded.script}", line 12, in load'
    assert cause.frames[0].splitlines()[1] == '    raise ValueError(f"bad shard {n}") from exc'
    assert frame_of(cause, 1) == f'File "{recorded.script}", line 16, in main'
    assert "in wrapper" in frame_of(cause, 2)  # @record's own frame, outermost in its stack
    assert len(cause.frames) == 3  # the KeyError's traceback (lookup) is the cause, not the failure
    assert not any("in lookup" in frame for frame in cause.frames)
    assert not any(set(line.strip()) <= set("^~") for frame in cause.frames for line in frame.splitlines())
    assert cause.as_json() == {
        "type": "ValueError",
        "message": "bad shard 7",
        "frames": list(cause.frames),
        "source": cause.source,
    }


def test_the_same_runs_stderr_gives_the_same_exception(recorded: Recorded) -> None:
    cause = from_traceback(recorded.stderr)
    assert cause is not None and cause.line == "ValueError: bad shard 7" and cause.source == "its stderr"
    assert frame_of(cause, 0) == f'File "{recorded.script}", line 12, in load'
    assert frame_of(cause, -1) == f'File "{recorded.script}", line 18, in <module>'  # stderr has the caller too


def test_root_cause_prefers_the_error_file_to_stderr(recorded: Recorded) -> None:
    other = formatted(lambda: int("x"))
    cause = root_cause(recorded.text, recorded.path, other)
    assert cause is not None and cause.kind == "ValueError" and cause.source.startswith("the error file")
    cause = root_cause("", "", other)  # no error file: stderr's
    assert cause is not None and (cause.kind, cause.source) == ("ValueError", "its stderr")
    assert cause.message == "invalid literal for int() with base 10: 'x'"
    cause = root_cause("{not json", recorded.path, other)  # one it cannot read: stderr's
    assert cause is not None and cause.source == "its stderr"
    assert root_cause("", "", ["all went well"]) is None


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


def _python(tmp: Path, name: str, text: str, *more: tuple[str, str]) -> list[str]:
    """The stderr of `python name` that fails."""
    (tmp / name).write_text(text)
    for other, body in more:
        (tmp / other).write_text(body)
    proc = subprocess.run([sys.executable, name], cwd=tmp, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    return proc.stderr.splitlines()


def test_a_script_that_does_not_compile(tmp_path: Path) -> None:
    """Python prints no Traceback header for the script itself: its file, line, code and caret."""
    lines = _python(tmp_path, "bad.py", "import os\nx = (\n")
    assert not any(line.startswith("Traceback") for line in lines)
    cause = from_traceback(lines)
    assert cause is not None and (cause.kind, cause.message) == ("SyntaxError", "'(' was never closed")
    assert cause.frames == (f'File "{tmp_path / "bad.py"}", line 2\n    x = (',)
    lines = _python(tmp_path, "indent.py", "if True:\nprint(1)\n")
    cause = from_traceback([*lines, "more output"])
    assert cause is not None and cause.kind == "IndentationError" and cause.message.startswith("expected an indented")


def test_a_module_that_does_not_compile_under_a_traceback(tmp_path: Path) -> None:
    lines = _python(tmp_path, "main.py", "import broken\n", ("broken.py", "def f(:\n"))
    cause = from_traceback(lines)
    assert cause is not None and (cause.kind, cause.message) == ("SyntaxError", "invalid syntax")
    assert frame_of(cause, 0) == f'File "{tmp_path / "broken.py"}", line 1'
    assert frame_of(cause, 1) == f'File "{tmp_path / "main.py"}", line 1, in <module>'


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
