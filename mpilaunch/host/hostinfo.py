"""What a job needs to know about one host's hardware: usable CPUs, GPUs, Ascend device IPs.

Asked by the launcher for its own host and by each remote agent for its host (the answer rides
in the `checked` reply), so it is stdlib only: shipped to remote hosts.
"""

from __future__ import annotations

import os

from mpilaunch.host.programs import find_program

SMI_TIMEOUT = 20.0  # seconds: nvidia-smi can be slow while the driver wakes up
_ADDRESS = r"^\s*address_(\d+)\s*=\s*(\S+)\s*$"  # compiled (and cached) by re on first use


def usable_cpus() -> int:
    """CPUs this process may run on (affinity, so a container's or a cpuset's limit counts)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def count_gpus(path: str) -> dict:
    """NVIDIA GPUs by `nvidia-smi -L` (one `GPU N: ...` line each; MIG lines are indented and not
    counted): {"count": N} or, where it cannot tell, {"count": None} with an "error" if it failed."""
    import subprocess  # only here: a run that counts no GPUs does not pay for it

    try:
        smi = find_program("nvidia-smi", {"PATH": path})
    except OSError:
        return {"count": None}
    try:
        proc = subprocess.run(
            [smi, "-L"], stdin=subprocess.DEVNULL, capture_output=True, timeout=SMI_TIMEOUT, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"count": None, "error": f"nvidia-smi -L: {exc}"}
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
        why = lines[-1] if lines else f"status {proc.returncode}"
        return {"count": None, "error": f"nvidia-smi -L failed: {why}"}
    text = proc.stdout.decode(errors="replace")
    return {"count": sum(1 for line in text.splitlines() if line.startswith("GPU "))}


def parse_hccn(text: str) -> dict[str, str]:
    """Device IPs from hccn.conf text: {"0": "192.1.27.6", ...} from `address_0=192.1.27.6` lines."""
    import re  # only here: the agent's start does not pay for it

    found: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(_ADDRESS, line)
        if match:
            found[str(int(match.group(1)))] = match.group(2)
    return found


def read_hccn(path: str) -> dict:
    """{"addresses": {...}} from the file, or {"error": why} when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return {"addresses": parse_hccn(handle.read(1 << 20))}
    except OSError as exc:
        return {"error": f"cannot read {path}: {exc.strerror or exc}"}


def probe(gpus: bool, hccn: str | None, path: str) -> dict:
    """This host's answers to what the job asks: always its CPUs; GPUs and device IPs on request."""
    info: dict = {"cpus": usable_cpus()}
    if gpus:
        info["gpus"] = count_gpus(path)
    if hccn:
        info["hccn"] = read_hccn(hccn)
    return info


def this_machine_address() -> str:
    """This machine's address on its default route (no packet is sent), for a rank table's
    server_id when every rank runs here; 127.0.0.1 without a network."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.255.255.255", 9))
            return sock.getsockname()[0]
        except OSError:
            return "127.0.0.1"
