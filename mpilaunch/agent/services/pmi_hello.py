"""The first words of a connection to the TCP PMI port (service pmi-tcp): what they say, and
the tally of the connections refused.

Anyone on the host may connect to a port of 127.0.0.1, so refusals are not news about the
job: the first one is said at once (a rank that could not connect fails, and this says why),
the others are counted and said in one line when the agent ends, however many there were.
"""

from __future__ import annotations

HELLO_MAX = 512  # bytes of a first line: `cmd=initack pmiid=N` is 30
REFUSED = "mpilaunch: refused a PMI connection that did not present a valid PMI_ID"
PMI2_REFUSED = (
    "a PMI-2 client connected over --pmi-tcp, and PMI-2 does not send PMI_ID; drop --pmi-tcp to serve it over PMI_FD"
)
WAIT = "wait"  # not a whole first line yet
ID = "id"  # `cmd=initack pmiid=N`: an id to look up
# Each way a connection is refused, as the summary counts it ("50 sent nothing").
KINDS = {
    "silent": "sent nothing",
    "garbage": "sent no PMI hello",
    "wrong": "presented a wrong or used PMI_ID",
    "pmi2": "spoke PMI-2, which sends no PMI_ID",
    "foreign": "came from another user",
    "left": "closed before it was answered",
}


def hello_words(buf: bytes | bytearray) -> dict[str, str]:
    """The `key=value` words of a TCP client's first line."""
    line = bytes(buf).split(b"\n", 1)[0].decode("ascii", "replace")
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def verdict(buf: bytes | bytearray, ended: bool) -> tuple[str, int]:
    """What a connection's first bytes say: (WAIT, 0) while its first line is not whole (and it
    has not ended or run out of time: `ended`), (ID, N) for a whole line `cmd=initack pmiid=N`,
    else (kind, 0) with kind one of KINDS. PMI-2 clients (MPICH's, Slurm's libpmi2) open with
    `cmd=init pmi_version=2` or a frame and never send PMI_ID."""
    if not buf:
        return ("silent", 0) if ended else (WAIT, 0)
    from mpilaunch.agent.services.pmi2 import looks_like_frame  # compiles its patterns: TCP hellos only

    frame = looks_like_frame(buf)  # a PMI-2 frame where the first line was expected: no newline to wait for
    if b"\n" not in buf and not frame:
        return (WAIT, 0) if not ended and len(buf) < HELLO_MAX else ("garbage", 0)
    words = hello_words(buf)
    claimed = words.get("pmiid", "")
    if words.get("cmd") == "initack" and claimed.isascii() and claimed.isdigit():
        return ID, int(claimed)
    if frame or (words.get("cmd") == "init" and words.get("pmi_version") == "2"):
        return "pmi2", 0
    return "garbage", 0


class Refusals:
    """The connections refused, by kind: the first one said at once, all of them summed up once."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, kind: str, uid: int | None = None) -> str | None:
        """Count one refusal; the line to say now if it is the first, else None."""
        first = not self.counts
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if not first:
            return None
        if kind == "pmi2":
            return f"{REFUSED}: {PMI2_REFUSED}"
        more = "any more are summed up at the end"
        if kind == "foreign":
            return f"mpilaunch: refused a PMI connection from a process of another user (uid {uid}); {more}"
        return f"{REFUSED} (it {KINDS[kind]}); {more}"

    def summary(self, where: str) -> str | None:
        """One line for every refusal, once more than one was made; None otherwise."""
        total = sum(self.counts.values())
        if total < 2:
            return None
        parts = ", ".join(f"{self.counts[kind]} {KINDS[kind]}" for kind in KINDS if kind in self.counts)
        return f"mpilaunch: refused {total} connections to the PMI port {where} in all: {parts}"
