"""`mpilaunch top`'s live screen, drawn with rich: the view of top_view.py refreshed every
second, a cursor and a selection moved by keys, and the grouped stacks of the selected ranks.

Keys are read from the terminal in cbreak mode between refreshes (nothing else reads it); the
terminal is given back as it was on every way out.
"""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from mpilaunch.cli import top_view
from mpilaunch.errors import LaunchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

KEYS_LINE = "up/down: move   space: select   s: stacks of the selected   esc: hide stacks   q: quit"
UP, DOWN = ("\x1b[A", "k"), ("\x1b[B", "j")


class Screen:
    def __init__(
        self,
        pid: int,
        path: str,
        stuck_after: float,
        look: Callable[[str, int], dict],
        stacks_of: Callable[[str, int, list[tuple[int, int]]], str],
        refresh: float,
    ) -> None:
        """look(path, pid): the job's answer; stacks_of(path, pid, ranks): their stacks' text."""
        self.pid, self.path, self.stuck_after, self.look = pid, path, stuck_after, look
        self.stacks_of, self.every = stacks_of, refresh
        self.console = Console()
        self.before: dict | None = None
        self.doc: dict | None = None
        self.rows: list[top_view.RankRow] = []
        self.cursor = 0
        self.selected: set[tuple[int, int]] = set()
        self.stacks: str | None = None  # the stacks shown, or None
        self.ended = ""

    def run(self) -> int:
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
        try:
            tty.setcbreak(fd)
            with Live(self.render(), console=self.console, screen=True, auto_refresh=False) as live:
                self.loop(live, fd)
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        if self.ended:
            print(f"mpilaunch top: {self.ended}", file=sys.stderr)
        return 0

    def loop(self, live: Live, fd: int) -> None:
        due = 0.0
        while True:
            now = time.monotonic()
            if now >= due:
                if not self.refresh():
                    return
                due = now + self.every
                live.update(self.render(), refresh=True)
            ready, _, _ = select.select([fd], [], [], max(0.0, due - time.monotonic()))
            if not ready:
                continue
            for key in keys(os.read(fd, 64).decode("utf-8", "replace")):
                if key in ("q", "Q", "\x03"):
                    return
                self.on_key(key, live)
            live.update(self.render(), refresh=True)

    def refresh(self) -> bool:
        """A new look at the job; False once it ended."""
        try:
            doc = self.look(self.path, self.pid)
        except LaunchError as exc:
            self.ended = "the job ended" if "ended" in str(exc) or "no running job" in str(exc) else str(exc)
            return False
        self.before, self.doc = self.doc, doc
        self.rows = top_view.rank_rows(doc, self.before, self.stuck_after)
        self.cursor = min(self.cursor, max(0, len(self.rows) - 1))
        return True

    def on_key(self, key: str, live: Live) -> None:
        if key in UP:
            self.cursor = max(0, self.cursor - 1)
        elif key in DOWN:
            self.cursor = min(len(self.rows) - 1, self.cursor + 1)
        elif key == " " and self.rows:
            self.selected ^= {self.rows[self.cursor].key}
        elif key == "\x1b":
            self.stacks = None
        elif key in ("s", "S") and self.rows:
            ranks = sorted(self.selected) or [self.rows[self.cursor].key]
            self.stacks = f"taking the stacks of {len(ranks)} rank{'s' if len(ranks) != 1 else ''}..."
            live.update(self.render(), refresh=True)
            try:
                self.stacks = self.stacks_of(self.path, self.pid, ranks)
            except LaunchError as exc:
                self.stacks = str(exc)

    def render(self) -> Group:
        if self.doc is None:
            return Group(Text(f"job {self.pid}: asking..."))
        line = top_view.summary(self.pid, self.doc, self.rows, self.console.size.width)
        parts: list[object] = [Text(line, style="bold", no_wrap=True, overflow="ellipsis")]
        room = self.console.size.height - 4
        if self.stacks is not None:
            panel_lines = self.stacks.rstrip("\n").splitlines()[: max(3, room // 2)]
            room -= len(panel_lines) + 2
        parts.append(self.table(max(3, room)))
        if self.stacks is not None:
            parts.append(Panel(Text("\n".join(panel_lines)), title="stacks", title_align="left"))
        parts.append(Text(KEYS_LINE, style="dim"))
        return Group(*parts)

    def table(self, room: int) -> Table:
        table = Table(box=None, pad_edge=False, show_edge=False)
        for name in ("", *top_view.COLUMNS):
            table.add_column(name, justify="right" if name in ("CPU%", "MEM", "QUIET", "PID") else "left")
        first = min(max(0, self.cursor - room // 2), max(0, len(self.rows) - room))
        for index in range(first, min(len(self.rows), first + room)):
            row = self.rows[index]
            mark = "*" if row.key in self.selected else " "
            style = "reverse" if index == self.cursor else "bold red" if row.stuck else ""
            table.add_row(mark, *top_view.cells(row), style=style)
        return table


def keys(typed: str) -> list[str]:
    """The keys in what one read gave: an arrow's escape sequence is one key."""
    found, at = [], 0
    while at < len(typed):
        size = 3 if typed.startswith("\x1b[", at) and at + 2 < len(typed) else 1
        found.append(typed[at : at + size])
        at += size
    return found
