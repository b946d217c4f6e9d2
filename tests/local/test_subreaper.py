"""The agent becomes a child subreaper (agent/reaper.become_subreaper), as the kernel reports it
in a forked child: through `_ctypes` and, where `_ctypes` lacks `call_function`, through ctypes."""

from __future__ import annotations

import os

import pytest

PR_GET_CHILD_SUBREAPER = 37


def _subreaper_in_child(drop_call_function: bool) -> int:
    """In a forked child: become_subreaper(), then the flag as the kernel reports it (1 or 0)."""
    import ctypes

    from mpilaunch.agent.reaper import become_subreaper

    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            if drop_call_function:  # an interpreter whose _ctypes lacks it: the ctypes way
                import _ctypes

                del _ctypes.call_function
            become_subreaper()
            flag = ctypes.c_int(-1)
            ctypes.CDLL(None).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
            code = flag.value
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.parametrize("drop_call_function", [False, True], ids=["_ctypes", "ctypes"])
def test_the_agent_becomes_a_child_subreaper(drop_call_function: bool) -> None:
    assert _subreaper_in_child(drop_call_function) == 1
