"""What the agent asks of the operating system to start, signal and reap processes, in one seam.

Ranks (ranks.py) and the Reaper (reaper.py) start, signal and reap through a HostOS, as
supervisor's processes do through its `options`: the real one here, a fake in the unit tests
(tests/unit/test_agent_os.py), so the code that spawns and kills is tested without processes.
Stdlib only: shipped with the agent.
"""

from __future__ import annotations

import os
import time

from mpilaunch.host import spawn
from mpilaunch.host.procfs import children_of

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see protocol/record.py)
if TYPE_CHECKING:
    from collections.abc import Sequence


class HostOS:
    """The real operating system."""

    def start(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        wdir: str | None,
        *,
        stdin: bool,
        merge: bool,
        pass_fds: Sequence[int],
        gate: spawn.Gate,
        cpus: list[int] | None = None,
    ) -> spawn.Started:
        """A process in a session of its own, held at gate; bound to cpus from its first
        instruction (we bind ourselves around its spawn: the child inherits the mask, and no
        Python runs in the child, which would cost a full fork instead of vfork)."""
        saved = None
        if cpus:
            saved = os.sched_getaffinity(0)
            os.sched_setaffinity(0, cpus)
        try:
            return spawn.start(argv, env, wdir, stdin=stdin, merge=merge, pass_fds=pass_fds, gate=gate)
        finally:
            if saved is not None:
                os.sched_setaffinity(0, saved)

    def killpg(self, group: int, sig: int) -> None:
        os.killpg(group, sig)

    def kill(self, pid: int, sig: int) -> None:
        os.kill(pid, sig)

    def getpgid(self, pid: int) -> int:
        return os.getpgid(pid)

    def getpgrp(self) -> int:
        return os.getpgrp()

    def reap(self) -> tuple[int, int, os.struct_rusage] | None:
        """A child that ended (pid, wait status, resource use), None if none has, without waiting;
        ChildProcessError when there is no child at all."""
        pid, status, usage = os.wait4(-1, os.WNOHANG)
        return (pid, status, usage) if pid else None

    def children(self, pid: int | None = None) -> list[int]:
        """The children of pid (this process's by default)."""
        return children_of(os.getpid() if pid is None else pid)

    def clock(self) -> float:
        return time.monotonic()
