"""The house's rules (docs/architecture.md, "Rules"), read from the code's own imports.

1. agent/, host/ and protocol/ import only each other and the standard library, and that set is
   exactly what is shipped to remote hosts.
2. plan/ imports nothing of the runtime: no fork, no socket, no process or descriptor work.
3. On the launcher's side, only transport/local.py imports agent/.
4. launcher/'s parts import each other only downwards (LAUNCHER_PARTS).
And no two modules import each other, directly or in a circle (TYPE_CHECKING imports count).
And of the tests: a unit test starts no process (tests/unit/conftest.py refuses it).
"""

from __future__ import annotations

import _posixsubprocess
import ast
import multiprocessing
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from mpilaunch.transport.bootstrap import SHIPPED, shipped_modules
from tests.conftest import ROOT

PACKAGE = ROOT / "mpilaunch"
SHIPPED_ROOMS = {"agent", "host", "protocol"}
# Standard library modules that start processes, open descriptors to the outside or wait on them.
RUNTIME_MODULES = {"socket", "_socket", "selectors", "select", "subprocess", "multiprocessing", "threading",
                   "signal", "asyncio", "ctypes", "pty", "fcntl", "resource"}  # fmt: skip
RUNTIME_CALLS = {"fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "popen", "kill", "killpg", "pipe",
                 "execv", "execve", "execvp", "execvpe", "setsid", "waitpid", "wait4", "socketpair"}  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it (inside functions and TYPE_CHECKING blocks too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module.startswith("mpilaunch"):  # `from mpilaunch.x import module`
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    known = modules()
    return {name for name in found if not name.startswith("mpilaunch") or name in known}


def room(name: str) -> str:
    """The folder of the package a module lives in ("" for the package itself and its top modules)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else ""


def test_shipped_rooms_import_only_each_other_and_the_standard_library() -> None:
    wrong = {}
    for name, path in modules().items():
        if room(name) not in SHIPPED_ROOMS:
            continue
        for imported in imports_of(path):
            top = imported.split(".")[0]
            ours = imported.startswith("mpilaunch")
            if (ours and imported != "mpilaunch" and room(imported) not in SHIPPED_ROOMS) or (
                not ours and top not in sys.stdlib_module_names
            ):
                wrong.setdefault(name, []).append(imported)
    assert not wrong


def test_what_is_shipped_is_exactly_those_rooms() -> None:
    assert set(SHIPPED) == SHIPPED_ROOMS
    expected = {"mpilaunch"} | {name for name in modules() if room(name) in SHIPPED_ROOMS}
    assert set(shipped_modules()) == expected


def test_the_planner_runs_nothing() -> None:
    wrong = {}
    for name, path in modules().items():
        if room(name) != "plan":
            continue
        bad = [m for m in imports_of(path) if m.split(".")[0] in RUNTIME_MODULES]
        allowed = {"mpilaunch", "mpilaunch.errors"}  # the package's version and the one exception type
        bad += [m for m in imports_of(path) if m.startswith("mpilaunch") and room(m) not in ("plan", "protocol")]
        bad = [m for m in bad if m not in allowed]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
                if node.attr in RUNTIME_CALLS:
                    bad.append(f"os.{node.attr}")
        if bad:
            wrong[name] = bad
    assert not wrong


def test_only_the_local_transport_imports_the_agent_on_the_launchers_side() -> None:
    importers = {
        name
        for name, path in modules().items()
        if room(name) != "agent" and any(room(m) == "agent" and m.startswith("mpilaunch") for m in imports_of(path))
    }
    assert importers == {"mpilaunch.transport.local"}


def test_no_import_circles() -> None:
    graph = {name: {m for m in imports_of(path) if m in modules() and m != name} for name, path in modules().items()}
    # a package's __init__ is imported with each of its modules: only real module edges count
    graph = {name: {m for m in edges if not modules()[m].name == "__init__.py"} for name, edges in graph.items()}
    circles = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles


GREETING = {"Hello", "Checked"}  # what an agent greets with (launcher/start/greeting.py reads them)


def test_no_transport_reads_a_greeting() -> None:
    """A transport only starts agents and hands back links, as hydra's launch backends do: none
    imports Hello or Checked to decode them (an annotation under TYPE_CHECKING is no reading),
    nor decodes an agent's message at all."""
    wrong = {}
    for name, path in modules().items():
        if room(name) != "transport":
            continue
        tree = ast.parse(path.read_text())
        guarded = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            for inner in ast.walk(node)
        }
        found = [
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and id(node) not in guarded
            for alias in node.names
            if alias.name in GREETING or alias.name in ("decode", "UP", "Decoder")
        ]
        if found:
            wrong[name] = found
    assert not wrong


def test_no_class_is_over_250_lines() -> None:
    """A class that big holds several concerns: split it (issue "House II")."""
    big = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 250:  # type: ignore[operator]
                big[f"{name}.{node.name}"] = node.end_lineno - node.lineno + 1  # type: ignore[operator]
    assert not big


def calls_to(tree: ast.AST, name: str) -> list[ast.Call]:
    """The calls of a function by that name, plain or as an attribute (cliopts.row_for)."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name)
    ]


def test_a_command_line_is_walked_once_by_one_tokenizer() -> None:
    """Issue "House III": only cli/tokens.py looks a word up among the table's spellings, and
    only cli/cmdline.read walks argv into tokens; every other reader (the early start, the
    PMIx guess, the dialect, the parse) takes what it made."""
    lookups, walks = set(), set()
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        if calls_to(tree, "row_for"):
            lookups.add(name)
        if calls_to(tree, "tokens"):
            walks.add(name)
    assert lookups == {"mpilaunch.cli.tokens"}
    assert walks == {"mpilaunch.cli.cmdline", "mpilaunch.cli.tokens"}  # tokens.scan walks only for tests


# What another launcher reads from the environment: only its module of cli/ names these.
LAUNCHER_VARIABLES = {"hydra": ("HYDRA_",), "torchrun": ("PET_", "TORCH_ELASTIC_")}


def test_each_launchers_words_are_its_own() -> None:
    """Issue "House III": mpilaunch's rows are in cli/cliopts.py and each other launcher's in its
    module (cliopts.LAUNCHERS), with its variables and its rules; no spelling is two rows'; and
    no other module of cli/ names a parameter of that launcher's (but those that are mpilaunch's
    fields by the same name, plan/spec.Options) or reads its variables."""
    from mpilaunch.cli import cliopts
    from mpilaunch.plan.spec import Options

    spellings = [flag for opt in cliopts.all_rows() for flag in opt.flags]
    assert len(spellings) == len(set(spellings))
    assert all(cliopts.OWN in opt.whose for opt in cliopts.ROWS)
    constants = {
        name: {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)}
        for name, path in modules().items()
        if name.startswith("mpilaunch.cli.")
    }
    for launcher, module_name in cliopts.LAUNCHERS.items():
        module = cliopts.load(launcher)
        assert module.RULES and module.ENVIRONMENT
        assert all(launcher in opt.whose and cliopts.OWN not in opt.whose for opt in module.ROWS)
        params = {opt.name for opt in module.ROWS} - set(Options._fields)
        prefixes = LAUNCHER_VARIABLES.get(launcher, ())
        for name, found in constants.items():
            if name == module_name:
                continue
            assert not params & found, (name, params & found)
            named = [v for v in found if isinstance(v, str) and prefixes and v.startswith(prefixes)]
            assert not named, (name, named)


# launcher/'s parts, and those of the others each may import: decisions and output below all,
# what the user reads above them, the looks at running ranks and MPI's job-wide half above that
# (with only the links of the loop: what they send on), the loop above those, the start on top.
LAUNCHER_PARTS = {
    "decide": set(),
    "output": set(),
    "meeting": set(),
    "report": {"decide", "output"},
    "stacks": {"decide", "output", "report", "loop.links"},
    "mpi": {"decide", "output", "loop.links"},
    "loop": {"decide", "output", "report", "stacks", "mpi"},
    "start": {"decide", "output", "report", "stacks", "mpi", "loop", "meeting"},
}


def test_launchers_parts_import_each_other_only_downwards() -> None:
    """Issue "House III": launcher/ shows its parts as subpackages, each with its rule."""
    parts = {p.name for p in (PACKAGE / "launcher").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert parts == set(LAUNCHER_PARTS)
    assert not [p.name for p in (PACKAGE / "launcher").glob("*.py") if p.name != "__init__.py"]
    wrong = {}
    for name, path in modules().items():
        part = name.split(".")[2] if name.startswith("mpilaunch.launcher.") else None
        if part not in LAUNCHER_PARTS:
            continue
        allowed = LAUNCHER_PARTS[part]
        bad = {
            other
            for other in imports_of(path)
            if other.startswith("mpilaunch.launcher.")
            and other.split(".")[2] != part
            and other.split(".")[2] not in allowed
            and ".".join(other.split(".")[2:4]) not in allowed
        }
        if bad:
            wrong[name] = sorted(bad)
    assert not wrong, wrong
    for part in LAUNCHER_PARTS:
        doc = ast.get_docstring(ast.parse((PACKAGE / "launcher" / part / "__init__.py").read_text()))
        assert doc and len(doc) > 80, f"launcher/{part}/__init__.py says what the part holds"


# Every way the standard library starts a process, as the guard of tests/unit/conftest.py must refuse it.
PROCESS_STARTS = {
    "subprocess.run": lambda: subprocess.run(["true"], check=False),
    "subprocess.Popen by posix_spawn": lambda: subprocess.Popen(["/bin/true"], close_fds=False),
    "os.fork": lambda: os.fork(),
    "os.posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], {}),
    "os.posix_spawnp": lambda: os.posix_spawnp("true", ["true"], {}),
    "os.system": lambda: os.system("true"),
    "os.popen": lambda: os.popen("true"),
    "os.spawnv": lambda: os.spawnv(os.P_WAIT, "/bin/true", ["true"]),
    "os.execv": lambda: os.execv("/bin/true", ["true"]),
    "pty.fork": lambda: pty.fork(),
    "multiprocessing, fork": lambda: multiprocessing.get_context("fork").Process(target=print).start(),
    "multiprocessing, spawn": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
}
# The calls those go through: each must be the guard's before any way above is tried (an os.fork
# not refused would fork this very test run).
GUARD_POINTS = [(os, n) for n in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve")]
GUARD_POINTS += [(subprocess, "_fork_exec"), (_posixsubprocess, "fork_exec")]


def test_a_unit_test_starts_no_process() -> None:
    """Issue "House III": the `unit` marker means no process is started. It is given to tests/unit
    alone, whose conftest refuses, while a test is set up, run and torn down (and its module
    imported), every way to start one: tried here, under that guard."""
    from tests.conftest import FOLDER_MARKS
    from tests.unit import conftest as guard

    assert [folder for folder, mark in FOLDER_MARKS.items() if mark == "unit"] == ["unit"]
    marked = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("*.py")
        if path.parent.name != "unit" and re.search(r"mark\.unit\b|add_marker\(\W*unit\W", path.read_text())
    ]
    assert not marked, f"tests outside tests/unit marked unit: {marked}"
    unguarded = [
        f"{module.__name__}.{name}" for module, name in GUARD_POINTS if getattr(module, name).__name__ != "refused"
    ]
    assert not unguarded, f"not refused in a unit test: {unguarded}"
    started = []
    for way, start in PROCESS_STARTS.items():
        try:
            start()
        except guard.StartedAProcess:
            continue
        started.append(way)
    guard.TRIED.clear()  # each was refused as it should be: this test passes
    assert not started, f"a unit test could start a process by {started}"
