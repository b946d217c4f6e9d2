"""Ship the agent to a host that has only Python 3: a short loader on the command line reads
the agent's modules from the channel and imports them from memory, so nothing is installed,
written to disk, or left behind, and no value of the job ever appears on a command line."""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
import zlib
from functools import lru_cache

from mpilaunch.transport.stage1 import STAGE1, python_line

# What runs on a remote host: these folders of the package, whole (stdlib only: tests check that
# they import nothing else), and the package itself.
SHIPPED = ("agent", "host", "protocol")
MIN_PYTHON = (3, 9)


# Stage 2, sent over the channel: an in-memory importer for the bundled modules, which follow
# as one more length-prefixed blob (marshal: a dict of bytes, readable by any Python 3), each
# module's code and source compressed on its own, so an agent decompresses only what it
# imports (about half of the code for a plain job). Where the host's Python has our bytecode
# magic, modules load precompiled.
# The importer is duck-typed, and ModuleSpec and the magic are taken from the import system's
# own modules, loaded in every Python: importing importlib.abc and importlib.util would put
# typing, contextlib and more on every agent's start, importlib itself `warnings`
# (docs/performance.md, "Start-up tricks").
# The agent gets this payload back (stage 2 is in the bundle): as a relay of tree spawn it
# starts agents on other hosts with the very code it runs. A finished agent leaves with os._exit:
# the interpreter's teardown would only delay the end of the job (srun, ssh wait for it).
LOADER = """import sys
if sys.version_info < MIN_PYTHON:
    sys.stderr.write("mpilaunch: the agent needs Python %d.%d or newer; this host runs %s\\n"
                     % (MIN_PYTHON + (sys.version.split()[0],)))
    raise SystemExit(4)
import marshal, zlib
ModuleSpec = sys.modules["_frozen_importlib"].ModuleSpec
MAGIC_NUMBER = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER
PACKED = r(int(r(10)))
BUNDLE = marshal.loads(PACKED)
SAME = BUNDLE["magic"] == MAGIC_NUMBER

class BundleImporter:
    def find_spec(self, name, path=None, target=None):
        if name in BUNDLE["modules"]:
            return ModuleSpec(name, self, is_package=BUNDLE["modules"][name][0])
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        is_package, source, code = BUNDLE["modules"][module.__name__]
        if is_package:
            module.__path__ = []
        if SAME:
            code = marshal.loads(zlib.decompress(code))
        else:
            code = compile(zlib.decompress(source).decode(), "<mpilaunch>/" + module.__name__, "exec")
        exec(code, module.__dict__)

sys.meta_path.insert(0, BundleImporter())
from mpilaunch.agent.agent import serve_stdio
STAGE2 = BUNDLE["stage2"].encode()
status = serve_stdio(b"%010d" % len(STAGE2) + STAGE2 + b"%010d" % len(PACKED) + PACKED)
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)
"""


def _agent_modules() -> dict[str, tuple[bool, bytes, bytes]]:
    """Every module the agent may import, by name: (is a package, source, marshalled code), the
    last two compressed.
    The code comes from the package's own loader, so an installed mpilaunch ships its cached
    bytecode instead of compiling the agent again at every launch."""
    modules = {}
    for name in shipped_modules():
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.loader is not None, name
        loader = spec.loader
        code = loader.get_code(name)  # type: ignore[attr-defined]
        source = loader.get_source(name)  # type: ignore[attr-defined]
        packed = (zlib.compress(source.encode()), zlib.compress(marshal.dumps(code)))
        modules[name] = (spec.submodule_search_locations is not None, *packed)
    return modules


def shipped_modules() -> list[str]:
    """The names of every module in the shipped folders (packages first, then their modules)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = ["mpilaunch"]
    for folder in SHIPPED:
        for where, dirs, files in os.walk(os.path.join(package, folder)):
            dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
            dotted = "mpilaunch." + os.path.relpath(where, package).replace(os.sep, ".")
            names.append(dotted)
            names += [f"{dotted}.{f[:-3]}" for f in sorted(files) if f.endswith(".py") and f != "__init__.py"]
    return names


def _blob(data: bytes) -> bytes:
    return b"%010d" % len(data) + data


@lru_cache(maxsize=2)
def agent_payload(magic: bytes = importlib.util.MAGIC_NUMBER) -> bytes:
    """What follows the command on the channel: stage 2, then the modules (each length-prefixed).
    magic is the bytecode version the precompiled modules are for (tests give another one to
    exercise the path of a host whose Python differs). Built once per version of the code and
    kept in the user's cache: reading it is much cheaper than building it, and every remote start
    pays it.

    What the cache holds is checked before it is sent (its key, then the payload's own digest):
    a file cut short or damaged made every SSH job fail later, blamed on the hosts. Such a file
    is replaced in the same run, said once; a cache that cannot be written is no error."""
    key, cache = _cache_file(magic)
    if cache is not None:
        from mpilaunch.host.files import read_kept

        data, why = read_kept(cache, CACHE_MAX)
        if data is not None:
            payload = data[80:]
            if data[:40] == key and data[40:80] == _digest(payload) and _whole(payload):
                return payload
            why = "not this code's" if len(data) >= 80 and data[:40] != key else "cut short or damaged"
        if why is not None:
            print(f"mpilaunch: the kept agent code {cache} was {why}: built and kept again", file=sys.stderr)
    payload = _build_payload(magic)
    if cache is not None:
        from mpilaunch.host.files import discard, keep

        if why is not None:
            discard(cache)
        keep(cache, key + _digest(payload) + payload)  # a read-only or full home: built each time
    return payload


CACHE_MAX = 64 << 20  # bytes: far above the payload's size (bench/imports.py prints it)


def _digest(payload: bytes) -> bytes:
    import hashlib

    return hashlib.sha1(payload).hexdigest().encode()  # 40 bytes


def _whole(payload: bytes) -> bool:
    """Stage 2 and the bundle, each behind its 10-digit length, and nothing after them."""
    at = 0
    for _ in range(2):
        head = payload[at : at + 10]
        if len(head) != 10 or not head.isdigit():
            return False
        at += 10 + int(head)
    return at == len(payload)


def _cache_file(magic: bytes) -> tuple[bytes, str | None]:
    """(the key of this code's payload, where it is kept): the key covers every shipped file's
    path, size and change time (and this file's: stage 2), the bytecode magic and this format."""
    import hashlib

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha1(b"payload 3" + magic)  # 3: modules compressed one by one
    for name in [*shipped_modules(), "mpilaunch.transport.bootstrap"]:  # the last: stage 2
        path = os.path.join(package, *name.split(".")[1:])
        path = os.path.join(path, "__init__.py") if os.path.isdir(path) else path + ".py"
        try:
            info = os.stat(path)
        except OSError:
            return b"", None
        digest.update(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    key = digest.hexdigest().encode()  # 40 bytes
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(home):
        return key, None
    return key, os.path.join(home, "mpilaunch", f"agent-{key[:16].decode()}.bin")


def _build_payload(magic: bytes) -> bytes:
    stage2 = f"MIN_PYTHON = {MIN_PYTHON!r}\n{LOADER}"
    bundle = marshal.dumps({"magic": magic, "modules": _agent_modules(), "stage2": stage2})
    return _blob(stage2.encode()) + _blob(bundle)


def agent_command(python: str | None = None) -> str:
    """The remote command: stage 1, with this launcher's interpreter where the same path exists."""
    return python_line(python or sys.executable, STAGE1)
