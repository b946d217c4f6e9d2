"""Start ranks: behind a gate, each in its own session, with pipes for its streams.

os.posix_spawn (like subprocess) suspends the agent until the child has exec'd, and once the
first ranks run (a Python rank is busy importing), an exec'ing child gets a sliver of a core:
on 2 cores, 32 Python ranks took 1.2 s to start, one after another, and finished 0.4 s later
than under hydra. So each rank starts as a tiny `/bin/sh` that waits at a gate (reads one
line from a pipe) and then execs the program: spawning a shell is quick while nothing else
runs, and the agent lets every rank of the launch through at once when all are spawned. If
the agent dies first, the gate gives no line and no rank starts.

What subprocess.Popen did for us is done here: the program is looked up on the rank's own
PATH (the shell's exec, after the same lookup here for a clear error), the signals Python
ignores (SIGPIPE, SIGXFSZ) are back to default in the rank, the signal mask is empty, the
working directory is the rank's, and only 0, 1, 2 and the descriptors given (a PMI socket) pass (every other
descriptor of the agent is close-on-exec: see close_on_exec_all). Not subprocess: its import
would be on every agent's start (docs/performance.md, "Start-up tricks").
"""

from __future__ import annotations

import _signal as signal
import os

from mpilaunch.host.programs import find_program

SHELL = "/bin/sh"
# $1... is the program as given (so the rank's argv[0] is too) and its arguments; the gate's
# descriptor (the lowest from 3 up that no passed descriptor has) is closed before the exec.
GATE_SCRIPT = 'read -r go <&{fd} || exit 125; exec {fd}<&-; exec "$@"'
# Python sets these to SIG_IGN at start-up; an ignored signal stays ignored across exec.
RESTORED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name))


class Started:
    """A started rank: its pid and the agent's ends of its pipes (None where not piped)."""

    __slots__ = ("pid", "stderr", "stdin", "stdout")

    def __init__(self, pid: int, stdin: int | None, stdout: int, stderr: int | None) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr


def close_on_exec_all() -> None:
    """Mark every descriptor above 2 close-on-exec, once, so that no rank inherits one the agent
    was given by whoever started it (Python's own descriptors are close-on-exec already)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:  # the listing's own descriptor, closed by now
                pass


def above(fd: int, floor: int) -> int:
    """fd itself if it is at least floor, else a close-on-exec copy that is (the original closed)."""
    if fd >= floor:
        return fd
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)
    os.close(fd)
    return high


def _above_stdio(fd: int) -> int:
    """fd, or a copy above 2 when it landed on a free 0, 1 or 2 (dup2 onto itself would leave it
    close-on-exec in the rank)."""
    return above(fd, 3)


def _pipe() -> tuple[int, int]:
    read, write = os.pipe()
    return _above_stdio(read), _above_stdio(write)


def _spawn(program: str, args: list[str], env: dict[str, str], actions: list) -> int:
    """posix_spawn in a new session; where the C library cannot do that (POSIX_SPAWN_SETSID came
    with glibc 2.26), in a new process group, which is what signals and kills address."""
    common = {"file_actions": actions, "setsigmask": (), "setsigdef": RESTORED_SIGNALS}
    try:
        return os.posix_spawn(program, args, env, setsid=True, **common)
    except NotImplementedError:
        return os.posix_spawn(program, args, env, setpgroup=0, **common)


class Gate:
    """A pipe the ranks of one launch wait on; release(n) lets n of them through."""

    def __init__(self) -> None:
        read, self.write = os.pipe()
        # Never 3 or 4, the numbers it gets in the rank: a dup2 onto itself would keep it
        # close-on-exec where the C library predates glibc 2.29.
        self.read = above(read, 5)

    def release(self, count: int) -> None:
        os.close(self.read)  # ours: with it closed, shells that died make the write fail, not hang
        try:
            lines = memoryview(b"go\n" * count)  # a line per rank; a full pipe waits for its readers
            while lines:
                lines = lines[os.write(self.write, lines) :]  # a signal can cut a write short
        except BrokenPipeError:  # no shell is waiting any more
            pass
        finally:
            os.close(self.write)


def start(
    argv: list[str],
    env: dict[str, str],
    wdir: str | None,
    stdin: bool,
    merge: bool,
    pass_fds: list[int] | tuple[int, ...],
    gate: Gate,
    found: dict[tuple[str, str | None], str] | None = None,
) -> Started:
    """Start argv in a new session, waiting at the gate; OSError if it cannot be started.
    found: programs already looked up on a PATH (the ranks of one launch run the same few), and
    where; filled in here."""
    key = (argv[0], env.get("PATH"))
    path = found.get(key) if found is not None else None
    if path is None:
        path = find_program(argv[0], env)  # the error, in words, now; the shell's exec finds the same file
        if found is not None:
            found[key] = path
    out_r, out_w = _pipe()
    err_r, err_w = _pipe() if not merge else (None, out_w)
    if stdin:
        in_r, in_w = _pipe()
    else:
        in_r, in_w = _above_stdio(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)), None
    child_ends = {in_r, out_w, err_w}
    gate_fd = next(fd for fd in range(3, 3 + len(pass_fds) + 2) if fd not in pass_fds and fd != gate.read)
    stdio = [(os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
    if argv[0].startswith("-"):  # bash as sh would read it as options of `exec`: no gate for it
        program, args, actions = path, argv, stdio
    else:
        program = SHELL
        args = ["sh", "-c", GATE_SCRIPT.format(fd=gate_fd), "mpilaunch-gate", *argv]
        actions = [*stdio, (os.POSIX_SPAWN_DUP2, gate.read, gate_fd)]
    here = None
    try:
        if wdir:
            here = os.open(".", os.O_RDONLY | os.O_CLOEXEC)
            os.chdir(wdir)  # the agent runs no threads: its directory is the next child's
        for fd in pass_fds:
            os.set_inheritable(fd, True)
        pid = _spawn(program, args, env, actions)
    except BaseException:
        for fd in (out_r, err_r, in_w):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in pass_fds:
            os.set_inheritable(fd, False)
        if here is not None:
            os.fchdir(here)
            os.close(here)
        for fd in child_ends:
            os.close(fd)
    return Started(pid, in_w, out_r, err_r)


def start_tool(path: str, argv: list[str], env: dict[str, str]) -> tuple[int, int]:
    """A helper program of the agent's own (a stack dumper), in a session of its own: its pid and
    the read end of one pipe that has its stdout and stderr; stdin is /dev/null."""
    out_r, out_w = _pipe()
    null = _above_stdio(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    actions = [(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, out_w, 2)]
    try:
        pid = _spawn(path, argv, env, actions)
    except BaseException:
        os.close(out_r)
        raise
    finally:
        os.close(out_w)
        os.close(null)
    return pid, out_r
