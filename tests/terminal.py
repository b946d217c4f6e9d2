"""A real terminal for tests: a tmux server of the test's own, a command in its one pane, keys
typed into it, its screen read back, and the terminal closed as a user closes a window.

The server has its own socket in the test's folder, so no other tmux is touched; the pane's
program gets the test's environment (the tag the `launcher` fixture looks for) but the server
does not carry it, and the server is ended by its recorded pid when the test is done.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from tests.procs import kill_and_wait


class Terminal:
    def __init__(self, folder: Path, env: dict[str, str], columns: int = 200, lines: int = 50) -> None:
        self.socket = str(folder / "tmux.sock")
        self.env = env
        self.own = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
        self.own["TERM"] = "xterm"
        self.size = (columns, lines)
        self.server_pid: int | None = None

    def tmux(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, *args], env=self.own, capture_output=True, text=True, timeout=30
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def start(self, argv: Sequence[str], cwd: Path) -> None:
        """Run argv in the pane; the pane stays open after it exits (to read its status)."""
        command = f"cd {shlex.quote(str(cwd))} && exec {shlex.join(argv)}"
        columns, lines = self.size
        given = [f"-e{name}={value}" for name, value in self.env.items() if name not in self.own]
        self.tmux("new-session", "-d", "-s", "t", "-x", str(columns), "-y", str(lines), *given, "sh", "-c", command)
        self.server_pid = int(self.tmux("display-message", "-p", "-t", "t", "#{pid}").strip())
        self.tmux("set-option", "-t", "t", "remain-on-exit", "on")

    def pane_pid(self) -> int:
        return int(self.tmux("display-message", "-p", "-t", "t", "#{pane_pid}").strip())

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-t", "t", "-S", "-200", check=False)

    def wait_for(self, found: Callable[[str], bool], timeout: float = 30.0) -> str:
        """The screen once found(screen) holds; AssertionError with the screen if it never does."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if found(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"not seen on the terminal in {timeout} s:\n{text}")
            time.sleep(0.05)

    def exit_status(self, timeout: float = 10.0) -> int:
        """The pane's program's exit status, once it exited; AssertionError if it was killed by a
        signal or is still running after timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.tmux("display-message", "-p", "-t", "t", "#{pane_dead} #{pane_dead_status}/#{pane_dead_signal}")
            dead, _, how = out.strip().partition(" ")
            status, _, sig = how.partition("/")
            if dead == "1" and status:
                return int(status)
            if dead == "1" and not sig and self.server_pid is not None:
                # tmux 3.3 here now and then leaves its pane's program a zombie it has not waited
                # for (its SIGCHLD lost): one more SIGCHLD to the server, by its recorded pid,
                # makes it wait and take the status
                os.kill(self.server_pid, signal.SIGCHLD)
            if (dead == "1" and sig) or time.monotonic() > deadline:
                raise AssertionError(f"the program in the terminal: dead {dead}, signal {sig}:\n{self.screen()}")
            time.sleep(0.05)

    def close(self) -> None:
        """Close the window: the terminal hangs up on what runs in it (SIGHUP)."""
        self.tmux("kill-session", "-t", "t", check=False)

    def end(self) -> None:
        self.tmux("kill-server", check=False)
        if self.server_pid is not None:
            kill_and_wait([self.server_pid])
        if os.path.exists(self.socket):
            os.unlink(self.socket)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.end()
