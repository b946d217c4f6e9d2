"""A unit test starts no process: while one is set up, run and torn down (fixtures of every scope
included), and while its module is imported, each way the standard library starts a process
raises StartedAProcess, and the phase fails even where the code under test caught that. A test
that needs a process belongs in tests/local/ (tests/unit/test_layout.py tries the guard)."""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

# The calls below which every process start of the standard library goes: subprocess (its own
# name for fork_exec, or posix_spawn), multiprocessing, os.system, os.popen, os.spawn*, os.exec*, pty.
GUARDED = [(os, name) for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve")]
GUARDED += [(subprocess, "_fork_exec"), (_posixsubprocess, "fork_exec")]
TRIED: list[str] = []  # the calls refused in the current phase: what it fails with


class StartedAProcess(AssertionError):
    """A unit test tried to start a process."""


@contextmanager
def no_process_started(where: str) -> Iterator[None]:
    """Every guarded call is refused inside (where: the test or module, for the message)."""

    def refuse(module: object, name: str):  # type: ignore[no-untyped-def]
        def refused(*args: object, **kwargs: object) -> None:
            TRIED.append(f"{module.__name__}.{name}")  # type: ignore[attr-defined]
            raise StartedAProcess(f"{where} started a process ({TRIED[-1]}): unit tests start none")

        return refused

    TRIED.clear()
    with ExitStack() as stack:
        for module, name in GUARDED:
            if hasattr(module, name):
                stack.enter_context(pytest.MonkeyPatch.context()).setattr(module, name, refuse(module, name))
        yield
    if TRIED:
        tried = sorted(set(TRIED))
        TRIED.clear()
        raise StartedAProcess(f"{where} started a process ({', '.join(tried)}): unit tests start none")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[pytest.CollectReport]:
    try:
        with no_process_started(collector.nodeid):
            report = yield
    except StartedAProcess as refused:
        return pytest.CollectReport(collector.nodeid, "failed", str(refused), [])
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with no_process_started(item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with no_process_started(item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with no_process_started(item.nodeid):
        return (yield)
