"""Starting ranks behind a gate (spawn.py): nothing runs before the gate lets it through, an
agent that dies first starts nothing, and a rank sees only what it should: its argv as given,
descriptors 0, 1, 2 and PMI_FD, default SIGPIPE."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from mpilaunch.host import spawn
from tests.conftest import Launcher


def _wait(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def test_nothing_runs_until_the_gate_lets_it_through(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    gate = spawn.Gate()
    started = spawn.start(["sh", "-c", f"touch {marker}; echo ran"], dict(os.environ), None, False, True, (), gate)
    try:
        assert os.waitpid(started.pid, os.WNOHANG) == (0, 0)  # alive, waiting at the gate
        assert not marker.exists()
    finally:
        gate.release(1)
    assert _wait(started.pid) == 0
    assert marker.exists()
    assert _read_all(started.stdout) == b"ran\n"


def test_a_gate_closed_without_a_release_starts_nothing(tmp_path: Path) -> None:
    """What a rank sees when its agent dies during the launch: end of file, no line."""
    marker = tmp_path / "ran"
    gate = spawn.Gate()
    started = spawn.start(["sh", "-c", f"touch {marker}"], dict(os.environ), None, False, True, (), gate)
    os.close(gate.write)
    os.close(gate.read)
    assert _wait(started.pid) == 125
    assert not marker.exists()
    _read_all(started.stdout)


# The rank is a shell (a Python rank would ignore SIGPIPE itself): its argv[0], the signals it
# ignores (SigIgn, from its parent's disposition), its descriptors and PMI_FD.
RANK = 'tr "\\0" "\\n" < /proc/$$/cmdline | head -n 1; grep SigIgn /proc/$$/status; ls /proc/$$/fd; echo "PMI=$PMI_FD"'


def test_a_rank_sees_its_argv_its_descriptors_and_default_sigpipe(launcher: Launcher) -> None:
    proc = launcher.run("-n", "2", "--oversubscribe", "--tag-output", "sh", "-c", RANK)
    assert proc.returncode == 0, proc.stderr
    by_rank: dict[str, list[str]] = {}
    for line in proc.stdout.decode().splitlines():
        tag, _, text = line.partition(":")
        by_rank.setdefault(tag, []).append(text.strip())
    assert len(by_rank) == 2
    for lines in by_rank.values():
        argv0, sig_ign, *fds, pmi = lines
        assert argv0 == "sh"  # as given: not the gate's shell, not a resolved path
        mask = int(sig_ign.split()[1], 16)
        assert not mask & (1 << (13 - 1)) and not mask & (1 << (25 - 1))  # SIGPIPE, SIGXFSZ: default
        pmi_fd = int(pmi.removeprefix("PMI="))
        assert sorted(map(int, fds)) == sorted([0, 1, 2, pmi_fd])  # nothing of the agent, the gate included


def test_release_returns_when_some_waiting_shells_died(tmp_path: Path) -> None:
    """The agent must not hang writing lines that nobody will read."""
    marker = tmp_path / "ran"
    gate = spawn.Gate()
    env = dict(os.environ)
    dead = spawn.start(["sh", "-c", "true"], env, None, False, True, (), gate)
    alive = spawn.start(["sh", "-c", f"touch {marker}"], env, None, False, True, (), gate)
    os.killpg(dead.pid, signal.SIGKILL)
    assert _wait(dead.pid) == -signal.SIGKILL
    gate.release(2)
    assert _wait(alive.pid) == 0
    assert marker.exists()
    for started in (dead, alive):
        _read_all(started.stdout)


def test_a_program_named_like_an_option_starts_without_the_gate(tmp_path: Path) -> None:
    """`-x` would be read as an option of the shell's `exec` (bash as /bin/sh)."""
    program = tmp_path / "-odd"
    program.write_text("#!/bin/sh\necho odd $1\n")
    program.chmod(0o755)
    gate = spawn.Gate()
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ.get('PATH', '')}"}
    started = spawn.start(["-odd", "one"], env, None, False, True, (), gate)
    gate.release(1)
    assert _wait(started.pid) == 0
    assert _read_all(started.stdout) == b"odd one\n"


def test_without_posix_spawn_setsid_a_rank_gets_its_own_process_group(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Python built against a C library older than glibc 2.26 raises NotImplementedError for
    setsid=True; the rank then leads a process group of its own, which is what kills address."""
    real = os.posix_spawn

    def without_setsid(*args, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("setsid"):
            raise NotImplementedError("setsid is not supported")
        return real(*args, **kwargs)

    monkeypatch.setattr(os, "posix_spawn", without_setsid)
    gate = spawn.Gate()
    started = spawn.start(["sh", "-c", "cut -d' ' -f5 /proc/$$/stat"], dict(os.environ), None, False, True, (), gate)
    gate.release(1)
    assert _wait(started.pid) == 0
    assert int(_read_all(started.stdout)) == started.pid


def test_a_launcher_whose_stdout_was_closed_still_runs(launcher: Launcher) -> None:
    """sys.stdout is None then: flushing it before the fork and at exit must not fail."""
    import subprocess

    proc = subprocess.run(
        launcher.argv("-n", "1", "true"),
        env=launcher.env,
        cwd=launcher.tmp_path,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.close(1),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert b"Traceback" not in proc.stderr
