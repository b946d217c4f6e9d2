"""Why a failed rank failed, in its own words: the exception torch's `@record` wrote to its
error file (TORCHELASTIC_ERROR_FILE), or else the Python traceback at the end of its stderr.
Pure: text in, a RootCause out, for the failure summary and --report-json."""

from __future__ import annotations

from collections.abc import Sequence

from mpilaunch.protocol.record import Record

FRAMES_SHOWN = 6  # innermost frames in the summary (--report-json has every one)
TRACEBACK = "Traceback (most recent call last):"
# what Python prints for the script itself without a traceback above: its file, line, caret
COMPILE_ERRORS = ("SyntaxError", "IndentationError", "TabError")


class RootCause(Record):
    """An exception: its type and message, its frames innermost first, and where it was read."""

    kind: str
    message: str
    frames: tuple[str, ...]  # 'File "x.py", line 3, in f' (then its source line, indented), innermost first
    source: str  # "the error file PATH" or "its stderr"

    @property
    def line(self) -> str:
        """`ValueError: bad shard 7`, as Python prints an exception's last line."""
        return f"{self.kind}: {self.message}" if self.message else self.kind

    def as_json(self) -> dict[str, object]:
        return {"type": self.kind, "message": self.message, "frames": list(self.frames), "source": self.source}


def from_error_file(text: str, path: str) -> RootCause | None:
    """torch.distributed.elastic's error file: {"message": {"message": "ValueError: ...",
    "extraInfo": {"py_callstack": "Traceback ...", "timestamp": ...}}} (or a plain message)."""
    import json

    try:
        document = json.loads(text)
    except (ValueError, RecursionError):  # the rank wrote what it liked there: [[[[... is no error file
        return None
    message = document.get("message") if isinstance(document, dict) else None
    if isinstance(message, str):
        kind, _, said = message.partition(": ")
        return RootCause(kind, said, (), _file(path))
    if not isinstance(message, dict):
        return None
    extra = message.get("extraInfo")
    stack = (extra.get("py_callstack") if isinstance(extra, dict) else None) or ""
    found = from_traceback(str(stack).splitlines(), _file(path)) if stack else None
    line = str(message.get("message") or "")
    kind, _, said = line.partition(": ")
    if found is not None:
        return found._replace(kind=kind or found.kind, message=said if kind else found.message)
    return RootCause(kind, said, (), _file(path)) if kind else None


def _file(path: str) -> str:
    return f"the error file {path}" if path else "its TORCHELASTIC_ERROR_FILE"


def from_traceback(lines: Sequence[str], source: str = "its stderr") -> RootCause | None:
    """The last Python traceback in these lines (a rank's last stderr lines), if one ends them."""
    starts = [i for i, line in enumerate(lines) if line.strip() == TRACEBACK]
    if not starts:
        starts = _compile_error(lines)
        if not starts:
            return None
    block = list(lines[starts[-1] + 1 :])
    frames: list[str] = []
    exception = ""
    for index, line in enumerate(block):
        stripped = line.strip()
        if stripped.startswith("File ") and ", line " in stripped:
            following = block[index + 1] if index + 1 < len(block) else ""
            code = following.strip()
            if following[:1].isspace() and code and not code.startswith("File ") and set(code) - set("^~ "):
                frames.append(f"{stripped}\n    {code}")
            else:
                frames.append(stripped)
        elif _exception_line(line) and not exception:
            exception = stripped
    if not exception:
        return None
    kind, _, said = exception.partition(": ")
    return RootCause(kind, said, tuple(reversed(frames)), source)


def _compile_error(lines: Sequence[str]) -> list[int]:
    """A script that does not compile: `  File "x.py", line 3` over its code and caret, then
    `SyntaxError: ...`; the index before that File line, as a traceback's header would be."""
    for end in range(len(lines) - 1, -1, -1):
        if lines[end].split(":", 1)[0] in COMPILE_ERRORS:
            for at in range(end - 1, max(end - 5, -1), -1):
                stripped = lines[at].strip()
                if stripped.startswith("File ") and ", line " in stripped:
                    return [at - 1]
            return []
    return []


def _exception_line(line: str) -> bool:
    """`ValueError: bad shard 7` or `KeyboardInterrupt`: not indented, a dotted name first."""
    if not line or line[0].isspace():
        return False
    name = line.split(":", 1)[0].strip()
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def root_cause(error: str, error_file: str, last_lines: Sequence[str]) -> RootCause | None:
    """The error file's exception when the rank left one, else its stderr's last traceback."""
    if error:
        found = from_error_file(error, error_file)
        if found is not None:
            return found
    return from_traceback(last_lines)
