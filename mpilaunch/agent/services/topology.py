"""This machine's hwloc description, kept for the PMIx server.

PMIx_server_init reads the machine with hwloc, PCI devices and their names included: most of
its time (docs/performance.md). Given the same description as an XML file (HWLOC_XMLFILE, with
HWLOC_THISSYSTEM=1 and HWLOC_THISSYSTEM_ALLOWED_RESOURCES=1, so that the CPUs this process may
use, a Slurm step's or a cgroup's, are still read from the system), it reads the file instead. The file is
written once per boot, host and hwloc version, after a start that read the machine itself;
the user's own HWLOC_XMLFILE wins.

With a kept description hwloc discovers nothing itself: its plugins (PCI, OpenCL, GL, CUDA,
...; the libxml2 reader, whose format hwloc's own reader reads as well) would be loaded only
to go unused, and they map libxml2, ICU, libstdc++, X11 and OpenCL into the agent, more than
its own code. They are kept out (HWLOC_PLUGINS_BLACKLIST) while the server reads a description
that was checked; a machine read in full loads them all.
"""

from __future__ import annotations

import ctypes
import os
import socket

from mpilaunch.host import files

KEEP_IMPORTANT = 3  # HWLOC_TYPE_FILTER_KEEP_IMPORTANT: the I/O devices MPI libraries look at
HWLOC_OBJ_PU = 3
MAX_DESCRIPTION = 64 << 20  # bytes: a machine of thousands of cores with every device is a few MB
NAMES = ("HWLOC_XMLFILE", "HWLOC_THISSYSTEM", "HWLOC_THISSYSTEM_ALLOWED_RESOURCES")
PLUGINS = "HWLOC_PLUGINS_BLACKLIST"
# hwloc 2's plugins: discovery that a description makes unneeded, and the libxml2 reader.
UNUSED_PLUGINS = ",".join(
    f"hwloc_{name}" for name in ("xml_libxml", "pci", "opencl", "cuda", "nvml", "rsmi", "levelzero", "gl")
)


def _hwloc() -> ctypes.CDLL | None:
    """hwloc 2 (libpmix.so.2 links it: loading it again costs nothing), or None."""
    try:
        return ctypes.CDLL("libhwloc.so.15")
    except OSError:
        return None


def cache_path() -> str | None:
    """Where this boot's description of this host goes, or None (no cache folder, no boot id)."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    hwloc = _hwloc()
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
    except OSError:
        return None
    if not os.path.isabs(home) or hwloc is None or not boot:
        return None
    hwloc.hwloc_get_api_version.restype = ctypes.c_uint
    version = f"{hwloc.hwloc_get_api_version():x}"
    return os.path.join(home, "mpilaunch", f"hwloc-{socket.gethostname()}-{boot}-{version}.xml")


class CachedTopology:
    """Around PMIx_server_init: `before` points hwloc at the kept file if there is one, `after`
    takes the variables back; `keep`, once the job is over, writes the description when the
    machine was read (off every job's path).

    A kept description is checked before PMIx is pointed at it: hwloc must load it, and it must
    not describe more processing units than this machine has. One that fails (cut short,
    `<topology/>`, another machine's, not a file) made every job of PMIx fail; it is discarded,
    the machine is read instead, and the description is kept again at the end of this run;
    `note` says so once. The topology loaded for the check is held until PMIx has read its own:
    hwloc then loads its components once, not twice."""

    def __init__(self) -> None:
        self.path = None if os.environ.get("HWLOC_XMLFILE") else cache_path()
        self.used = False
        self.note: str | None = None
        self.held: ctypes.c_void_p | None = None
        self.plugins: str | None = None  # the user's HWLOC_PLUGINS_BLACKLIST, while ours is set

    def before(self) -> None:
        if self.path is None:
            return
        data, why = files.read_kept(self.path, MAX_DESCRIPTION)
        if data is None and why is None:  # none kept yet
            return
        if data is not None:
            self.plugins = os.environ.get(PLUGINS, "")
            os.environ[PLUGINS] = f"{self.plugins},{UNUSED_PLUGINS}" if self.plugins else UNUSED_PLUGINS
        why = f"was {why}" if data is None else self.check(data)
        if why is None:
            os.environ.update(dict(zip(NAMES, (self.path, "1", "1"))))
            self.used = True
            return
        self.release()  # the machine is read instead, with every plugin
        self.restore_plugins()
        files.discard(self.path)
        self.note = f"the kept hwloc description {self.path} {why}: discarded, this machine is read instead"

    def check(self, data: bytes) -> str | None:
        """None if hwloc loads the description and it fits this machine, else what is wrong."""
        hwloc = _hwloc()
        if hwloc is None:
            return None  # PMIx will say what it thinks
        topology = ctypes.c_void_p()
        if hwloc.hwloc_topology_init(ctypes.byref(topology)) != 0:
            return None
        self.held = topology
        buffer = ctypes.create_string_buffer(data)  # with its ending \0, which the size counts
        if hwloc.hwloc_topology_set_xmlbuffer(topology, buffer, len(data) + 1) or hwloc.hwloc_topology_load(topology):
            return "is refused by hwloc"
        hwloc.hwloc_get_nbobjs_by_depth.restype = ctypes.c_uint
        depth = hwloc.hwloc_get_type_depth(topology, HWLOC_OBJ_PU)
        units = hwloc.hwloc_get_nbobjs_by_depth(topology, depth) if depth >= 0 else 0
        cpus = os.cpu_count() or 1
        if not 1 <= units <= cpus:
            return f"describes {units} processing units (this machine has {cpus})"
        return None

    def release(self) -> None:
        """Destroy the topology loaded by check (hwloc unloads its components with the last)."""
        if self.held is not None:
            hwloc = _hwloc()
            if hwloc is not None:
                hwloc.hwloc_topology_destroy(self.held)
            self.held = None

    def restore_plugins(self) -> None:
        if self.plugins is not None:
            if self.plugins:
                os.environ[PLUGINS] = self.plugins
            else:
                os.environ.pop(PLUGINS, None)
            self.plugins = None

    def after(self) -> None:
        self.release()
        self.restore_plugins()
        if self.used:
            for name in NAMES:
                os.environ.pop(name, None)

    def keep(self) -> None:
        if not self.used and self.path is not None and not os.path.isfile(self.path):
            write_description(self.path)


def write_description(path: str) -> bool:
    """Read the machine with hwloc and keep its description at path (whole, or nothing: a full
    disk or a directory in its place leave no partial file)."""
    hwloc = _hwloc()
    if hwloc is None:
        return False
    topology = ctypes.c_void_p()
    if hwloc.hwloc_topology_init(ctypes.byref(topology)) != 0:
        return False
    try:
        hwloc.hwloc_topology_set_io_types_filter(topology, KEEP_IMPORTANT)
        if hwloc.hwloc_topology_load(topology) != 0:
            return False
        text = ctypes.c_void_p()
        size = ctypes.c_int()
        if hwloc.hwloc_topology_export_xmlbuffer(topology, ctypes.byref(text), ctypes.byref(size), 0) != 0:
            return False
        try:
            data = ctypes.string_at(text.value, max(0, size.value - 1))  # without the ending \0
        finally:
            hwloc.hwloc_free_xmlbuffer(topology, text)
        return files.keep(path, data)
    finally:
        hwloc.hwloc_topology_destroy(topology)
