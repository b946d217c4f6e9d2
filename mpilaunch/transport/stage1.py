"""Stage 1 of an agent's start, the program on its command line (bootstrap.py sends the rest),
and that command line, also for an agent that connects back (an engine's task). entry.main
imports this before the launcher's own imports when it starts a Slurm step, so it imports
nothing: shlex would bring `re`."""

from __future__ import annotations

# Say where the stream starts, read a length-prefixed program from stdin and run it.
STAGE1 = """import os
os.write(1, b"\\0mpilaunch-agent\\0")
def r(n):
    b = b""
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            raise SystemExit(3)
        b += c
    return b
exec(compile(r(int(r(10))), "<mpilaunch-loader>", "exec"))
"""

SECRET_VAR = "MPILAUNCH_AGENT_SECRET"  # in an engine's task's environment; the agent takes it out of its own
SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")


def quote(word: str) -> str:
    """word as one word of sh, as shlex.quote writes it."""
    if word and all(c in SAFE for c in word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def python_line(python: str, code: str) -> str:
    """sh running code with this interpreter where its path exists, else python3. -S: the
    agent needs no site-packages, and skipping them saves start-up time."""
    return f'p={quote(python)}; [ -x "$p" ] || p=python3; exec "$p" -S -c {quote(code)}'


def connect_back_line(address: str, port: int, python: str, token: str) -> str:
    """What an engine's task runs (an srun step's, a qrsh's): Python connects back, says who it
    is (the secret from its environment, taken out of it, and `token`, Python code for the
    word that names its host), and makes the connection its stdin and stdout; then it is the
    agent's loader, as over SSH. `_socket`, not `socket` (its import is most of such a Python's
    start), and the address as bytes (no idna codec): the agent's start is what a job waits on.
    IPv4, as the launcher listens. TCP_NODELAY: see connect_back.py."""
    prelude = (
        "import os, _socket as so, sys\n"
        f"w = {token}\n"
        "s = so.socket(so.AF_INET, so.SOCK_STREAM)\n"
        "try:\n"
        f"    s.connect(({address.encode()!r}, {port}))\n"
        "except OSError as e:\n"
        f'    sys.stderr.write("mpilaunch: agent on %s: cannot connect back to {address}:{port}: %s\\n" % (w, e))\n'
        "    raise SystemExit(1)\n"
        "s.setsockopt(so.IPPROTO_TCP, so.TCP_NODELAY, 1)\n"
        f'who = os.environ.pop("{SECRET_VAR}", "") + " " + w\n'
        's.sendall((who + "\\n").encode())\n'
        "os.dup2(s.fileno(), 0)\n"
        "os.dup2(s.fileno(), 1)\n"
    )
    return python_line(python, prelude + STAGE1)
