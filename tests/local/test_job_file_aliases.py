"""YAML aliases in a job file (issue 27, item 3): a file under 1 MiB whose `env:` held 40,000
aliases of one 400 KB string reached MemoryError at 2.9 GB (a traceback); a 100 MB expansion
ended in an internal frame-length error, status 141. What a job file stands for once its aliases
are expanded is bounded (4 MiB of text); beyond, or an alias that expands without end, is one
line naming the file, status 2, before anything is built.

Each run's address space is capped (RLIMIT_AS), so that a launcher that expanded the aliases
would fail here instead of taking the machine's memory.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import pytest

from tests.conftest import Launcher

PY = sys.executable
MEMORY_CAP = 2 << 30


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


BIG = "x" * 400_000
HOSTS = ",".join(f"node{i}:1" for i in range(3000))  # 30 KB
SHAPES = {
    # the report's: env of 40,000 aliases of one 400 KB string (16 GB)
    "env-40000": "env:\n  BIG: &a " + BIG + "\n" + "".join(f"  V{i}: *a\n" for i in range(40_000)) + "command: true\n",
    # its 100 MB form, which ended in a frame-length error
    "env-250": "env:\n  BIG: &a " + BIG + "\n" + "".join(f"  V{i}: *a\n" for i in range(250)) + "command: true\n",
    # the "billion laughs": ten levels of ten aliases of the level below, the last one the command
    "laughs": "".join(f"level{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "lol"] * 10) + "]\n" for i in range(10))
    + "command: *l9\n",
    # 5,000 programs, each an alias of one app with a 2 KB command
    "apps": "apps:\n  - &app {np: 1, command: [echo, " + "y" * 2000 + "]}\n" + "  - *app\n" * 5000,
    # aliases as the names of env: (a 400 KB name, 20 times)
    "keys": "env:\n  ? &k " + "K" * 400_000 + "\n  : v\n" + "  ? *k\n  : v\n" * 20 + "command: [true]\n",
    # -H as a list of 200 aliases of a 30 KB host list
    "hosts": f"host: &h '{HOSTS}'\nextra: [" + ", ".join(["*h"] * 200) + "]\ncommand: true\n",
}
LOOPS = {
    "sequence": "command: &c [echo, *c]\n",
    "mapping": "env: &e {A: *e}\ncommand: true\n",
    "deep": "apps: &a\n  - np: 1\n    command: [echo, {x: [*a]}]\n",
}


def _refused(launcher: Launcher, path: Path) -> str:
    proc = launcher.run("--config", str(path), timeout=120, preexec_fn=_cap)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and proc.stdout == b"", err[-2000:]
    assert len(err.splitlines()) == 1 and err.startswith(f"mpilaunch: {path}"), err[-2000:]
    return err


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_aliases_that_expand_too_far_are_refused_naming_the_file(
    launcher: Launcher, tmp_path: Path, shape: str
) -> None:
    path = tmp_path / f"{shape}.yaml"
    path.write_text(SHAPES[shape])
    assert path.stat().st_size < 1 << 20  # under the job file's own limit: only the aliases make it big
    err = _refused(launcher, path)
    assert err == f"mpilaunch: {path}: YAML: its aliases expand it beyond 4 MiB of text; refused\n"


@pytest.mark.parametrize("shape", sorted(LOOPS))
def test_an_alias_inside_the_node_it_names_is_refused(launcher: Launcher, tmp_path: Path, shape: str) -> None:
    path = tmp_path / f"{shape}.yaml"
    path.write_text(LOOPS[shape])
    err = _refused(launcher, path)
    assert err == f"mpilaunch: {path}: YAML: an alias inside the node it names (it expands without end)\n"


def test_aliases_within_the_bound_still_work(launcher: Launcher, tmp_path: Path) -> None:
    """An anchor used a few times (one value for several variables) is what aliases are for."""
    path = tmp_path / "job.yaml"
    path.write_text(
        "env:\n  FIRST: &v shared-value\n  SECOND: *v\n"
        "apps:\n  - &app {np: 1, command: [sh, -c, 'echo $FIRST $SECOND']}\n  - *app\n"
    )
    proc = launcher.run("--config", str(path), preexec_fn=_cap)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().splitlines() == ["shared-value shared-value"] * 2
