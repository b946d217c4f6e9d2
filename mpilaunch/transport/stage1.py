"""Stage 1 of an agent's start, the program on its command line (bootstrap.py sends the rest),
and that command line. entry.main imports this before the launcher's own imports
when it starts a Slurm step, so it imports nothing: shlex would bring `re`."""

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
