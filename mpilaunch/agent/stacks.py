"""Every running rank's stack, taken on this host by the agent, which is already the ranks' parent.

The program is not changed and not asked: a tool reads the rank from outside. Python ranks are
read by py-spy (their Python frames, every thread) where it is installed here; native programs,
and Python ranks where py-spy is not, by eu-stack (elfutils) or else gdb (native frames). The
tools are looked for in the agent's interpreter's own bin directory first (where `pip install
'mpilaunch[debug]'` put py-spy, even in a venv that is not activated), then on the host's PATH.

While a request is answered, the host's ranks are stopped (SIGSTOP to each rank's process group,
SIGCONT once every one was read): the tools get the cores instead of competing with ranks that
spin in an MPI progress loop (on a small machine with many ranks, reading them running took
ten times as long: bench/stacks.py), and the stacks are one moment of the host. The ranks'
results do not change; a signal sent to them meanwhile reaches them when they go on. py-spy
reads a stopped rank without attaching (--nonblocking).

Each tool runs as a child of the agent in a session of its own, its output read through the
agent's loop (the loop never waits for it), PARALLEL at a time, each bounded by the request's
limit: one that outstays it is killed with its group. The text goes up whole, as the tool
printed it; the launcher reads the frames out of it (launcher/stacks/stack_text.py). Stdlib only:
shipped with the agent, imported on the first request.
"""

from __future__ import annotations

import _signal as signal
import os
import sys

from mpilaunch.agent.loop import Loop, Timer
from mpilaunch.protocol.messages import RankStack, Stacks, TakeStacks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from mpilaunch.agent.host_os import HostOS
    from mpilaunch.agent.ranks import Ranks
    from mpilaunch.protocol.record import Record

PARALLEL = 16  # tool processes at once: a few per core is enough to hide their waits on the ranks
MAX_TEXT = 1 << 18  # bytes of one tool's output sent up (a deep stack of many threads is far less)
SHELLS = ("sh", "bash", "dash", "zsh", "ksh")  # a rank that is a shell waiting on one child: the child is read
NO_TOOL = "no py-spy, eu-stack or gdb"


def is_python(host_os: HostOS, pid: int) -> bool:
    """The process runs a Python interpreter (its program's name, or libpython in its maps)."""
    program = host_os.program_of(pid)
    return program.startswith(("python", "pypy")) or (bool(program) and b"/libpython" in host_os.maps(pid))


def target_of(host_os: HostOS, pid: int) -> int:
    """The process whose stack says what the rank does: the rank itself, or, for a shell that
    runs one program and waits for it (`sh -c 'python train.py'`), that program."""
    for _ in range(4):
        below = host_os.children(pid) if host_os.program_of(pid) in SHELLS else []
        if len(below) != 1:
            return pid
        pid = below[0]
    return pid


def command_for(tools: dict[str, str], python: bool, pid: int) -> tuple[str, list[str]] | None:
    """(tool, argv) that reads this process (python: it runs Python), or None when no tool here can."""
    if "py-spy" in tools and python:
        return "py-spy", [tools["py-spy"], "dump", "--nonblocking", "--pid", str(pid)]
    if "eu-stack" in tools:
        return "eu-stack", [tools["eu-stack"], "-m", "-s", "-p", str(pid)]
    if "gdb" in tools:
        return "gdb", [tools["gdb"], "-p", str(pid), "-batch", "-nx", "-q", "-ex", "thread apply all bt"]
    return None


class Reading:
    """One tool run on one rank."""

    __slots__ = ("chunks", "deadline", "fd", "ident", "pid", "size", "tool", "tool_pid")

    def __init__(self, ident: int, pid: int, tool: str, tool_pid: int, fd: int, deadline: float) -> None:
        self.ident = ident
        self.pid = pid  # the process read (the rank, or the program its shell runs)
        self.tool = tool
        self.tool_pid = tool_pid
        self.fd = fd
        self.deadline = deadline
        self.chunks: list[bytes] = []
        self.size = 0


class StackTaker(Timer):
    """Answers TakeStacks: one request at a time, in the order they came."""

    def __init__(
        self,
        loop: Loop,
        send: Callable[[Record], None],
        ranks: Ranks,
        watch: Callable[[int], None],
        env: dict[str, str],
    ) -> None:
        self.loop = loop
        self.send = send
        self.ranks = ranks
        self.os = ranks.os  # tools started, ranks stopped and read: the seam tests replace
        self.watch = watch  # the guardian kills a tool with the ranks if the agent dies
        self.env = env  # the host's environment (its PATH finds the tools), final once ranks run
        self.requests: list[TakeStacks] = []
        self.todo: list[tuple[int, int]] = []  # (process id, pid) of the request being answered
        self.reading: dict[int, Reading] = {}  # by the tool's pipe
        self.done: list[RankStack] = []
        self.tools: dict[str, str] = {}
        self.stopped: list[int] = []  # the ranks (and their groups) stopped for the request
        self.lacks = ""
        loop.add_timer(self)

    def handle(self, message: TakeStacks) -> None:
        self.requests.append(message)
        if len(self.requests) == 1:
            self.begin()

    def begin(self) -> None:
        folders = [os.path.dirname(sys.executable), *self.env.get("PATH", os.defpath).split(os.pathsep)]
        self.tools = self.os.executables(("py-spy", "eu-stack", "gdb"), folders)  # the interpreter's own bin first
        live = [(ident, rp.pid) for ident, rp in sorted(self.ranks.by_ident.items()) if rp.status is None]
        self.stopped = [pid for _, pid in live]
        self.signal_stopped(signal.SIGSTOP)
        self.todo = [(ident, target_of(self.os, pid)) for ident, pid in live]
        self.done = []
        self.lacks = self.lacking(self.todo)
        self.more()

    def lacking(self, todo: list[tuple[int, int]]) -> str:
        """What this host lacks that some of its ranks need: "tools", "py-spy" or nothing."""
        if not todo or "py-spy" in self.tools:
            return ""
        if not self.tools:
            return "tools"
        return "py-spy" if any(is_python(self.os, pid) for _, pid in todo) else ""

    def more(self) -> None:
        """Start tools while there is room; answer once every rank of the request is read."""
        request = self.requests[0]
        env = {k: v for k, v in self.env.items() if k != "DEBUGINFOD_URLS"}  # nothing fetched from the network
        env["RUST_BACKTRACE"] = "0"  # py-spy's errors in one line, without its own stack
        while self.todo and len(self.reading) < PARALLEL:
            ident, pid = self.todo.pop(0)
            found = command_for(self.tools, "py-spy" in self.tools and is_python(self.os, pid), pid)
            if found is None:
                self.done.append(RankStack(proc=ident, why=NO_TOOL))
                continue
            tool, argv = found
            try:
                tool_pid, fd = self.os.start_tool(argv[0], argv, env)
            except OSError as exc:
                self.done.append(RankStack(proc=ident, tool=tool, why=f"{tool} could not start: {exc.strerror}"))
                continue
            self.watch(tool_pid)
            self.reading[fd] = Reading(ident, pid, tool, tool_pid, fd, self.os.clock() + request.limit)
            self.loop.watch(fd, self.read)
        if not self.todo and not self.reading:
            self.signal_stopped(signal.SIGCONT)
            self.stopped = []
            self.send(Stacks(snap=request.snap, stacks=tuple(sorted(self.done)), lacks=self.lacks))
            self.requests.pop(0)
            if self.requests:
                self.begin()

    def read(self, fd: int) -> None:
        reading = self.reading[fd]
        try:
            data = os.read(fd, 1 << 16)
        except OSError:
            data = b""
        if data:
            if reading.size < MAX_TEXT:
                reading.chunks.append(data[: MAX_TEXT - reading.size])
                reading.size += len(data)
            return
        self.finish(reading, "")

    def finish(self, reading: Reading, why: str) -> None:
        self.loop.unwatch(reading.fd)
        os.close(reading.fd)
        del self.reading[reading.fd]
        if why:  # it outstayed the limit
            self.os.killpg(reading.tool_pid, signal.SIGKILL)
        text = b"".join(reading.chunks).decode("utf-8", "replace")
        self.done.append(RankStack(proc=reading.ident, text=text, tool=reading.tool, why=why))
        self.more()

    def signal_stopped(self, sig: int) -> None:
        """Stop or resume the request's ranks that still run (a reaped rank's pid is not ours)."""
        for pid in self.stopped:
            if self.ranks.is_live(pid):
                self.os.killpg(pid, sig)

    def next_deadline(self) -> float | None:
        return min((r.deadline for r in self.reading.values()), default=None)

    def tick(self, now: float) -> None:
        for reading in [r for r in self.reading.values() if now >= r.deadline]:
            limit = self.requests[0].limit
            self.finish(reading, f"{reading.tool} gave no stack within {limit:g} s")
