"""A limit of this host that stopped the launcher or an agent, in a user's words.

`ulimit -u 6` or `ulimit -n 20` makes a fork, a pipe or a thread fail deep inside the run;
Python says `BlockingIOError(11, ...)`, `OSError(24, ...)` or "can't start new thread", which
names neither the limit nor its value. These words do: "too many open files (ulimit -n 20)".
"""

from __future__ import annotations

import errno

# errno -> (what ran out, the resource limit that sets it, ulimit's flag for it)
_LIMITS = {
    errno.EMFILE: ("too many open files", "RLIMIT_NOFILE", "-n"),
    errno.EAGAIN: ("too many processes", "RLIMIT_NPROC", "-u"),
    errno.ENOMEM: ("out of memory", "RLIMIT_AS", "-v"),
}
_SYSTEM = {errno.ENFILE: "the system's table of open files is full"}
THREAD = "can't start new thread"  # Python's RuntimeError when the thread's clone fails


def limit_words(exc: BaseException) -> str | None:
    """What ran out, with the limit's value when one is set ("too many processes (ulimit -u
    6)"); None when exc is no such failure. A thread that cannot start counts as a process:
    the kernel counts threads against `ulimit -u`."""
    if isinstance(exc, RuntimeError) and THREAD in str(exc):
        code = errno.EAGAIN
    elif isinstance(exc, OSError) and exc.errno in _SYSTEM:
        return _SYSTEM[exc.errno]
    elif isinstance(exc, OSError) and exc.errno in _LIMITS:
        code = exc.errno
    else:
        return None
    what, name, flag = _LIMITS[code]
    value = _soft_limit(name)
    if value is not None and flag == "-v":
        value //= 1024  # ulimit -v counts KiB
    return f"{what} (ulimit {flag} {value})" if value is not None else what


def _soft_limit(name: str) -> int | None:
    """The soft limit, None when there is none (or it cannot be read)."""
    try:
        import resource

        soft = resource.getrlimit(getattr(resource, name))[0]
    except (ImportError, AttributeError, ValueError, OSError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft
