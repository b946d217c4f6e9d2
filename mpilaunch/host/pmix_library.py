"""Where a host's PMIx server library is: read before a job is planned (can this host serve
PMIx at all?) and by the agent's PMIx service (which one to load). No ctypes here."""

from __future__ import annotations

import os

# Where a host's own PMIx library usually is (Debian and Ubuntu's libpmix2, RPM distributions,
# a source install); the ranks' own Open MPI's library comes first when it can be found.
LIBRARY_PLACES = (
    "/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2",
    "/usr/lib/aarch64-linux-gnu/pmix2/lib/libpmix.so.2",
    "/usr/lib64/pmix/lib/libpmix.so.2",
    "/usr/lib64/libpmix.so.2",
    "/usr/lib/libpmix.so.2",
    "/usr/local/lib/libpmix.so.2",
    "/opt/pmix/lib/libpmix.so.2",
)


def host_library(requested: str | None = None, own: str | None = None) -> str | None:
    """--pmix-lib, else the ranks' own Open MPI's, else the first of LIBRARY_PLACES here."""
    return requested or own or next((path for path in LIBRARY_PLACES if os.path.exists(path)), None)
