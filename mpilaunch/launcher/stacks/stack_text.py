"""A stack tool's output read as threads of frames: pure text in, records out.

The agents send what py-spy, eu-stack or gdb printed, whole (agent/stacks.py); grouping needs
each rank's stack as frames that compare equal across ranks, so everything that differs from
one process to the next is left out: thread ids, addresses, argument values, idle or active.
A frame reads `file:line in function` where the tool knew the line, else `function (library)`
or `function`. Frames are listed outermost first, as a call path reads.
"""

from __future__ import annotations

import os
import re

from mpilaunch.protocol.record import Record

MAIN = "main"  # a native program's main thread (the one whose id is the process id); others by number

_PYSPY_THREAD = re.compile(r'Thread (0x[0-9A-Fa-f]+|\d+) \((\w+)\)(?:: "(.*)")?\s*$')
_PYSPY_FRAME = re.compile(r"\s+(\S.*?) \((.+?)(?::(\d+))?\)\s*$")
_EU_THREAD = re.compile(r"TID (\d+):\s*$")
_EU_PID = re.compile(r"PID (\d+) ")
_EU_FRAME = re.compile(r"#\d+\s+0x[0-9a-fA-F]+\s*(\S*)(?: - (\S+))?\s*$")
_EU_SOURCE = re.compile(r"\s+(\S+?):(\d+)(?::\d+)?\s*$")
_GDB_THREAD = re.compile(r"Thread (\d+) \(.*?(?:LWP (\d+))?.*\):\s*$")
_GDB_FRAME = re.compile(r"#\d+\s+(?:0x[0-9a-fA-F]+ in )?(\S+)(?: \(.*\))?(?: at (\S+):(\d+)| from (\S+))?\s*$")


class Thread(Record):
    """One thread of a rank: its name (the same in every rank that runs the same code) and its
    frames, outermost first."""

    name: str
    frames: tuple[str, ...]


def frame(function: str, source: str | None, line: str | None, library: str | None) -> str:
    """`file:line in function`, `function (library)` or `function`."""
    function = function.split("@", 1)[0] or "??"  # clock_nanosleep@GLIBC_2.2.5
    if source and line:
        return f"{os.path.basename(source)}:{line} in {function}"
    if library:
        return f"{function} ({os.path.basename(library)})"
    return function


Read = list[tuple[str, list[str]]]  # a reader's threads: (name, frames as the tool prints them, innermost first)


def read_pyspy(text: str) -> Read:
    threads: Read = []
    for line in text.splitlines():
        header = _PYSPY_THREAD.match(line)
        if header is not None:
            threads.append((header.group(3) or str(len(threads) + 1), []))
            continue
        found = _PYSPY_FRAME.match(line) if threads else None
        if found is not None:
            function, where, number = found.groups()
            threads[-1][1].append(frame(function, where, number, None if number else where))
    return threads


def read_eu_stack(text: str) -> Read:
    threads: Read = []
    pid = ""
    for line in text.splitlines():
        if _EU_PID.match(line) and not pid:
            pid = line.split()[1]
            continue
        header = _EU_THREAD.match(line)
        if header is not None:
            threads.append((MAIN if header.group(1) == pid else str(len(threads) + 1), []))
            continue
        frames = threads[-1][1] if threads else []
        found = _EU_FRAME.match(line) if threads else None
        if found is not None:
            frames.append(frame(found.group(1), None, None, found.group(2)))
            continue
        source = _EU_SOURCE.match(line) if frames else None
        if source is not None:  # -s: the line of the frame above
            function = frames[-1].split(" (", 1)[0]
            frames[-1] = frame(function, source.group(1), source.group(2), None)
    return threads


def read_gdb(text: str) -> Read:
    threads: Read = []
    for line in text.splitlines():
        header = _GDB_THREAD.match(line)
        if header is not None:
            threads.append((MAIN if header.group(1) == "1" else header.group(1), []))
            continue
        found = _GDB_FRAME.match(line) if line.startswith("#") else None
        if found is not None:
            if not threads:  # a program without threads: gdb prints no thread header
                threads.append((MAIN, []))
            function, source, number, library = found.groups()
            threads[-1][1].append(frame(function, source, number, library))
    return threads


READERS = {"py-spy": read_pyspy, "eu-stack": read_eu_stack, "gdb": read_gdb}


def threads_of(tool: str, text: str) -> tuple[tuple[Thread, ...], str]:
    """(the threads, main first; or none and why not, in the tool's last words)."""
    reader = READERS.get(tool)
    read = reader(text) if reader is not None else []
    threads = [Thread(name, tuple(reversed(frames))) for name, frames in read if frames]
    if not threads:
        said = [line.strip() for line in text.splitlines() if line.strip()]
        said = [line for line in said if line.startswith("Error:")][:1] or said[-1:]  # py-spy's error first
        return (), f"{tool}: {said[0][:200]}" if said else f"{tool or 'the tool'} printed no stack"
    main = [t for t in threads if t.name in (MAIN, "MainThread")][:1]
    return tuple(main + [t for t in threads if t not in main]), ""
