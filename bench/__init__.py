"""Benchmarks run by hand (docs/performance.md): mpilaunch against mpirun and hydra."""

from __future__ import annotations

import os

TAG = "MPILAUNCH_BENCH_TAG"  # in every launcher's environment: what a run left is found by it


def tagged(tag: str) -> list[int]:
    """The processes (zombies too) whose environment holds TAG=tag."""
    found = []
    needle = f"{TAG}={tag}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found
