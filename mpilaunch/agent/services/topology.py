"""This machine's hwloc description, kept for the PMIx server.

PMIx_server_init reads the machine with hwloc, PCI devices and their names included: 12 of
its 17 ms here. Given the same description as an XML file (HWLOC_XMLFILE, with
HWLOC_THISSYSTEM=1 and HWLOC_THISSYSTEM_ALLOWED_RESOURCES=1, so that the CPUs this process may
use, a Slurm step's or a cgroup's, are still read from the system), it takes 5. The file is
written once per boot, host and hwloc version, after a start that read the machine itself;
the user's own HWLOC_XMLFILE wins.
"""

from __future__ import annotations

import ctypes
import os
import socket

KEEP_IMPORTANT = 3  # HWLOC_TYPE_FILTER_KEEP_IMPORTANT: the I/O devices MPI libraries look at
NAMES = ("HWLOC_XMLFILE", "HWLOC_THISSYSTEM", "HWLOC_THISSYSTEM_ALLOWED_RESOURCES")


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
    machine was read (4 ms, off every job's path)."""

    def __init__(self) -> None:
        self.path = None if os.environ.get("HWLOC_XMLFILE") else cache_path()
        self.used = False

    def before(self) -> None:
        if self.path is not None and os.path.isfile(self.path):
            os.environ.update(dict(zip(NAMES, (self.path, "1", "1"))))
            self.used = True

    def after(self) -> None:
        if self.used:
            for name in NAMES:
                os.environ.pop(name, None)

    def keep(self) -> None:
        if not self.used and self.path is not None and not os.path.isfile(self.path):
            write_description(self.path)


def write_description(path: str) -> bool:
    """Read the machine with hwloc and write it to path (whole or not at all)."""
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
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}"
        if hwloc.hwloc_topology_export_xml(topology, partial.encode(), 0) != 0:
            return False
        os.replace(partial, path)
        return True
    except OSError:
        return False
    finally:
        hwloc.hwloc_topology_destroy(topology)
