"""Why a rank failed (launcher/report/root_cause.py), read from inputs made for real: an error file
torch 2.13's `@record` writes (a script run once for this module with TORCHELASTIC_ERROR_FILE
set: torch's import takes a few seconds), the same run's stderr, and scripts that do not
compile, as Python prints them. The same reading of inputs made here: tests/unit/test_root_cause.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mpilaunch.launcher.report.root_cause import from_error_file, from_traceback, root_cause
from tests.unit.test_root_cause import formatted, frame_of

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
