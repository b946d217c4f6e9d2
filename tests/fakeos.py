"""A fake operating system for the agent's OS seam (mpilaunch/agent/host_os.py), as supervisor's
tests run with DummyOptions: processes that exist only here, with real pipes (the agent's loop
reads them) and made-up pids; what the agent asks (starts, signals, waits) is recorded, exits are
wait statuses the test queues, and /proc is what the test writes. No process is started."""

from __future__ import annotations

import fnmatch
import os

from mpilaunch.agent.loop import Loop
from mpilaunch.agent.ranks import Ranks
from mpilaunch.agent.reaper import Reaper
from mpilaunch.host import spawn
from mpilaunch.protocol.messages import RankSpec

WALL = 1795000000.0  # the fake's wall clock is its monotonic clock plus this


class Usage:
    ru_utime, ru_stime, ru_maxrss = 0.25, 0.5, 2048


class FakeOS:
    """Processes that exist only here: each start gets the next pid and real pipes; what the
    agent asks (starts, signals) is recorded; reap() gives back the exits queued by the test."""

    def __init__(self) -> None:
        self.now = 100.0
        self.next_pid = 5000
        self.started: list[tuple[tuple[str, ...], list[int] | None]] = []
        self.signals: list[tuple[str, int, int]] = []  # ("killpg" | "kill", target, signal)
        self.exits: list[tuple[int, int]] = []  # (pid, wait status) to reap
        self.kids: dict[int, list[int]] = {}  # pid -> its children (0: the agent's)
        self.groups: dict[int, int] = {}  # pid -> process group
        self.ends: dict[int, list[int]] = {}  # pid -> the test's ends of its stdout/stderr pipes
        self.refuse: OSError | None = None  # the next start fails so
        # what agent/death.py reads
        self.files: dict[str, str] = {}  # path -> text (/proc files, cgroup files)
        self.kmsg: list[str] | None = None  # the kernel log's records (None: not readable)
        self.on_disk: dict[str, float] = {}  # path -> modification time (core files)
        self.zombies: dict[int, str] = {}  # pid -> its /proc/PID/cgroup while a zombie
        # what a relay, the stack taker and the guardian ask
        self.stdins: dict[int, int] = {}  # pid -> the test's end of its stdin pipe
        self.tools: list[tuple[str, ...]] = []  # the argv of each tool started
        self.guardian: tuple[tuple[str, ...], int, int] | None = None  # its argv, a copy of its pipe, its table
        self.waited: list[int] = []
        self.start_times: dict[int, bytes] = {}
        self.programs: dict[int, str] = {}  # pid -> the name of its program file
        self.memory_maps: dict[int, bytes] = {}
        self.installed: set[str] = set()  # paths of executable files
        self.ssh = (9, 6)  # what `ssh -V` says
        self.ssh_asked: list[str] = []

    def start(self, argv, env, wdir, *, stdin, merge, pass_fds, gate, cpus=None, found=None):  # type: ignore[no-untyped-def]
        if self.refuse is not None:
            error, self.refuse = self.refuse, None
            raise error
        pid = self.child()
        out_r, out_w = os.pipe()
        err_r, err_w = (None, None) if merge else os.pipe()
        self.ends[pid] = [fd for fd in (out_w, err_w) if fd is not None]
        in_w = None
        if stdin:
            self.stdins[pid], in_w = os.pipe()
        self.started.append((tuple(argv), cpus))
        return spawn.Started(pid, in_w, out_r, err_r)

    def child(self) -> int:
        """A new child of the agent's, in a session (hence a group) of its own."""
        pid = self.next_pid
        self.next_pid += 1
        self.kids.setdefault(0, []).append(pid)
        self.groups[pid] = pid
        return pid

    def start_tool(self, path: str, argv: list[str], env: dict[str, str]) -> tuple[int, int]:
        pid = self.child()
        out_r, out_w = os.pipe()
        self.ends[pid] = [out_w]
        self.tools.append(tuple(argv))
        return pid, out_r

    def start_guardian(self, argv: list[str], pipe: int, table: int) -> int:
        self.guardian = (tuple(argv), os.dup(pipe), table)
        return self.child()

    def wait(self, pid: int) -> None:
        self.waited.append(pid)
        self.kids[0].remove(pid)

    def start_time(self, pid: int) -> bytes | None:
        return self.start_times.get(pid)

    def program_of(self, pid: int) -> str:
        return self.programs.get(pid, "")

    def maps(self, pid: int) -> bytes:
        return self.memory_maps.get(pid, b"")

    def executables(self, names, folders):  # type: ignore[no-untyped-def]
        found = {}
        for name in names:
            installed = [path for path in (os.path.join(f or ".", name) for f in folders) if path in self.installed]
            if installed:
                found[name] = installed[0]
        return found

    def ssh_version(self, env: dict[str, str], program: str) -> tuple[int, int]:
        self.ssh_asked.append(program)
        return self.ssh

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def killpg(self, group: int, sig: int) -> None:
        self.signals.append(("killpg", group, sig))

    def kill(self, pid: int, sig: int) -> None:
        self.signals.append(("kill", pid, sig))

    def getpgid(self, pid: int) -> int:
        return self.groups[pid]

    def getpgrp(self) -> int:
        return 1

    def reap(self):  # type: ignore[no-untyped-def]
        if not self.kids.get(0) and not self.exits:
            raise ChildProcessError
        if not self.exits:
            return None
        pid, status = self.exits.pop(0)
        self.kids[0].remove(pid)
        return pid, status, Usage()

    def children(self, pid=None):  # type: ignore[no-untyped-def]
        return list(self.kids.get(0 if pid is None else pid, []))

    def clock(self) -> float:
        return self.now

    def wall(self) -> float:
        return WALL + self.now

    def read_text(self, path: str) -> str | None:
        return self.files.get(path)

    def cwd_of(self, pid: int | None) -> str | None:
        return "/work" if pid is None else self.files.get(f"/proc/{pid}/cwd")

    def kernel_log(self) -> list[str] | None:
        return self.kmsg

    def matches(self, pattern: str) -> list[tuple[str, float]]:
        return [(path, mtime) for path, mtime in self.on_disk.items() if fnmatch.fnmatchcase(path, pattern)]

    def identity(self) -> tuple[int, int, str]:
        return 1000, 1000, "node1"

    def zombie_cgroup(self, pid: int) -> str | None:
        return self.zombies.get(pid)

    def end(self, pid: int, status: int) -> None:
        """The process ends: its pipes close, its wait status is there to reap."""
        for fd in self.ends.pop(pid, []):
            os.close(fd)
        self.exits.append((pid, status))


class Agent:
    """Ranks and a Reaper over the fake, and what they sent up."""

    def __init__(self) -> None:
        self.os = FakeOS()
        self.loop = Loop(self.os.clock)
        self.sent: list[object] = []
        self.watched: list[int] = []
        self.ranks = Ranks(self.loop, self.sent.append, lambda frame: None, self.watched.append, self.os)
        self.reaper = Reaper(self.ranks)
        self.loop.add_timer(self.reaper)
        self.loop.add_timer(self.ranks)
        self.loop.add_timer(self.ranks.death)

    def spawn(self, proc: int, argv: tuple[str, ...] = ("prog",), cpus: list[int] | None = None) -> bool:
        spec = RankSpec(proc=proc, rank=proc, local_rank=proc, app=0, argv=argv, wdir="/", env={})
        return self.ranks.spawn(1, spec, {}, False, cpus, spawn.Gate(), [])

    def turns(self, count: int = 3) -> None:
        for _ in range(count):
            self.loop.turn()

    def close(self) -> None:
        for fd in [fd for fds in self.os.ends.values() for fd in fds] + list(self.os.stdins.values()):
            os.close(fd)
        if self.os.guardian is not None:
            os.close(self.os.guardian[1])
        self.loop.close()
