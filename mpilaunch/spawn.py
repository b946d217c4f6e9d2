"""Start one rank with os.posix_spawn: pipes for its streams, its own session, nothing else kept.

Not subprocess.Popen: importing subprocess costs every agent about 8 ms at start, and Popen's
file objects and error pipe are work the agent does not need (it reaps its children itself).
What Popen did for us is done here: the program is looked up on the rank's own PATH, the
signals Python ignores (SIGPIPE, SIGXFSZ) are back to default in the rank, the signal mask
is empty, the working directory is the rank's, and only 0, 1, 2 and the PMI descriptor pass
(every other descriptor of the agent is close-on-exec: see close_on_exec_all).
"""

from __future__ import annotations

import os
import signal

from mpilaunch.programs import find_program

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


def _above_stdio(fd: int) -> int:
    """fd itself, or a copy above 2 when it landed on a free 0, 1 or 2 (dup2 onto itself would
    leave it close-on-exec in the rank)."""
    if fd > 2:
        return fd
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return high


def _pipe() -> tuple[int, int]:
    read, write = os.pipe()
    return _above_stdio(read), _above_stdio(write)


def start(
    argv: list[str], env: dict[str, str], wdir: str | None, stdin: bool, merge: bool, pass_fd: int | None
) -> Started:
    """Start argv in a new session; OSError (FileNotFoundError, PermissionError, ...) if it cannot."""
    path = find_program(argv[0], env)
    out_r, out_w = _pipe()
    err_r, err_w = _pipe() if not merge else (None, out_w)
    if stdin:
        in_r, in_w = _pipe()
    else:
        in_r, in_w = _above_stdio(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)), None
    child_ends = {in_r, out_w, err_w}
    here = None
    try:
        if wdir:
            here = os.open(".", os.O_RDONLY | os.O_CLOEXEC)
            os.chdir(wdir)  # the agent runs no threads: its directory is the next child's
        if pass_fd is not None:
            os.set_inheritable(pass_fd, True)
        pid = os.posix_spawn(
            path,
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, in_r, 0),
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
            ],
            setsid=True,
            setsigmask=(),
            setsigdef=RESTORED_SIGNALS,
        )
    except BaseException:
        for fd in (out_r, err_r, in_w):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        if pass_fd is not None:
            os.set_inheritable(pass_fd, False)
        if here is not None:
            os.fchdir(here)
            os.close(here)
        for fd in child_ends:
            os.close(fd)
    return Started(pid, in_w, out_r, err_r)
