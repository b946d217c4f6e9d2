"""Devices and threads per rank: --devices-per-rank, DEVICE_ID, OMP_NUM_THREADS, RANK_TABLE_FILE.

Pure functions of the placement, the user's variables and what each host said about itself
(`hostinfo.probe`: usable CPUs, GPUs counted by `nvidia-smi -L`, Ascend device IPs).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from mpilaunch.errors import LaunchError
from mpilaunch.plan.hosts import Host
from mpilaunch.plan.placement import Rank

# The device lists a rank's framework reads; a user who set one of them chose the devices.
DEVICE_LISTS = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
DEFAULT_LIST = "CUDA_VISIBLE_DEVICES"  # narrowed when the user set none of them
HCCN_CONF = "/etc/hccn.conf"  # where Ascend's hccn_tool keeps each device's IP (address_N=IP)


def parse_device_list(value: str) -> list[str]:
    """`"2, 3"` -> ["2", "3"]. Entries stay strings: GPU UUIDs and MIG names are valid too."""
    return [d.strip() for d in value.split(",") if d.strip()]


def exported_names(exports: Sequence[tuple[str, str | None]], launcher_env: Mapping[str, str]) -> set[str]:
    """Variables that -x gives the ranks (they win over the launcher's defaults)."""
    return {name for name, value in exports if value is not None or name in launcher_env}


def user_device_lists(
    launcher_env: Mapping[str, str], exports: Sequence[tuple[str, str | None]]
) -> dict[str, list[str]]:
    """The device lists the user set, in DEVICE_LISTS order: -x NAME=value, else the launcher's
    own value (also behind a bare -x NAME)."""
    given = {name: value for name, value in exports if value is not None}
    lists = {}
    for name in DEVICE_LISTS:
        value = given.get(name, launcher_env.get(name))
        if value is not None:
            lists[name] = parse_device_list(value)
    return lists


def host_device_lists(
    host: str, local_size: int, per_rank: int, user_lists: Mapping[str, list[str]], gpus: Mapping | None
) -> dict[str, list[str]]:
    """The devices one host's ranks share: the user's lists, else the GPUs nvidia-smi counted
    there, else 0..local_size*per_rank-1. Too few for the host's ranks: status 2."""
    need = local_size * per_rank
    if user_lists:
        lists = dict(user_lists)
        sources = {name: f"{name}={','.join(devices)} lists {len(devices)}" for name, devices in lists.items()}
    elif gpus is not None and gpus.get("count") is not None:
        lists = {DEFAULT_LIST: [str(i) for i in range(int(gpus["count"]))]}
        sources = {DEFAULT_LIST: f"nvidia-smi -L on {host} counts {gpus['count']}"}
    else:
        return {DEFAULT_LIST: [str(i) for i in range(need)]}
    for name, devices in lists.items():
        if len(devices) < need:
            ranks = "1 rank" if local_size == 1 else f"{local_size} ranks"
            raise LaunchError(
                f"--devices-per-rank {per_rank}: {host} runs {ranks} of the job, which need {need} devices; "
                f"{sources[name]}"
            )
    return lists


def rank_slice(devices: Sequence[str], local_rank: int, per_rank: int) -> list[str]:
    """Local rank i gets devices i*N .. i*N+N-1 of its host's list."""
    return list(devices[local_rank * per_rank : (local_rank + 1) * per_rank])


def physical_device(local_rank: int, per_rank: int | None, lists: Mapping[str, list[str]]) -> str:
    """The device a rank uses, as its host numbers it (the rank table's device_id): the first of
    its slice, or, without --devices-per-rank, entry `local rank` of the user's list, or the
    local rank itself."""
    index = local_rank * (per_rank or 1)
    first = next(iter(lists.values()), [])
    return first[index] if index < len(first) else str(local_rank)


def omp_threads(cpus: int, local_size: int) -> int:
    """OMP_NUM_THREADS when the user set none: the host's CPUs shared by its ranks, at least 1."""
    return max(1, cpus // max(1, local_size))


def job_device_lists(
    ranks: Sequence[Rank],
    hosts: Sequence[Host],
    host_info: Mapping[int, Mapping],
    per_rank: int | None,
    user_lists: Mapping[str, list[str]],
) -> dict[int, dict[str, list[str]]]:
    """Each used host's device lists (checked against its ranks when --devices-per-rank is given)."""
    out: dict[int, dict[str, list[str]]] = {}
    for rank in ranks:
        if rank.host in out:
            continue
        if per_rank:
            gpus = host_info.get(rank.host, {}).get("gpus")
            out[rank.host] = host_device_lists(hosts[rank.host].name, rank.local_size, per_rank, user_lists, gpus)
        else:
            out[rank.host] = dict(user_lists)
    return out


def rank_extras(
    ranks: Sequence[Rank],
    hosts: Sequence[Host],
    host_info: Mapping[int, Mapping],
    *,
    per_rank: int | None,
    rank_table: str | None,
    launcher_env: Mapping[str, str],
    exports: Sequence[tuple[str, str | None]],
    torch_omp: bool = False,
) -> list[dict[str, str]]:
    """Per rank: its device lists narrowed and DEVICE_ID 0 (with --devices-per-rank),
    OMP_NUM_THREADS and RANK_TABLE_FILE. -x wins, except over the device lists, which
    --devices-per-rank exists to narrow. The launcher's OMP_NUM_THREADS goes to every host, as
    the user's choice for all ranks; without one, each host's CPUs are shared by its ranks
    (torch_omp, torchrun's rule: 1 with several ranks on a host, none for one)."""
    exported = exported_names(exports, launcher_env)
    user_omp = launcher_env.get("OMP_NUM_THREADS")
    lists = job_device_lists(ranks, hosts, host_info, per_rank, user_device_lists(launcher_env, exports))
    out = []
    for rank in ranks:
        env: dict[str, str] = {}
        if per_rank:
            for name, devices in lists[rank.host].items():
                env[name] = ",".join(rank_slice(devices, rank.local_rank, per_rank))
            if "DEVICE_ID" not in exported:
                env["DEVICE_ID"] = "0"  # the first of its own devices, as its framework numbers them
        cpus = host_info.get(rank.host, {}).get("cpus")
        if "OMP_NUM_THREADS" in exported:
            pass
        elif user_omp is not None:
            env["OMP_NUM_THREADS"] = user_omp
        elif torch_omp:
            if rank.local_size > 1:
                env["OMP_NUM_THREADS"] = "1"
        elif cpus:
            env["OMP_NUM_THREADS"] = str(omp_threads(int(cpus), rank.local_size))
        if rank_table and "RANK_TABLE_FILE" not in exported:
            env["RANK_TABLE_FILE"] = rank_table
        out.append(env)
    return out


def omp_note(
    ranks: Sequence[Rank],
    hosts: Sequence[Host],
    envs: Iterable[Mapping[str, str]],
    host_info: Mapping[int, Mapping],
    launcher_env: Mapping[str, str],
    exports: Sequence[tuple[str, str | None]],
    torch_omp: bool = False,
) -> str | None:
    """The one line that says OMP_NUM_THREADS was chosen for the user, when a host runs several
    ranks (as torchrun warns); None when there is nothing to say."""
    if "OMP_NUM_THREADS" in launcher_env or "OMP_NUM_THREADS" in exported_names(exports, launcher_env):
        return None
    chosen: dict[int, tuple[str, int, int]] = {}
    for rank, env in zip(ranks, envs):
        if "OMP_NUM_THREADS" in env and rank.local_size > 1 and host_info.get(rank.host, {}).get("cpus"):
            chosen[rank.host] = (env["OMP_NUM_THREADS"], int(host_info[rank.host]["cpus"]), rank.local_size)
    if not chosen:
        return None
    if torch_omp:
        detail = "1 per rank, as torchrun"
    elif len(set(chosen.values())) == 1:
        value, cpus, size = next(iter(chosen.values()))
        detail = f"{value} per rank ({cpus} CPUs, {size} ranks{'' if len(chosen) == 1 else ' a host'})"
    else:
        shown = list(chosen.items())[:3]
        detail = ", ".join(f"{v} on {hosts[h].name}" for h, (v, _c, _s) in shown) + (", ..." if len(chosen) > 3 else "")
    return f"OMP_NUM_THREADS={detail}; set it to choose"


def probe_request(
    per_rank: int | None,
    rank_table: str | None,
    launcher_env: Mapping[str, str],
    exports: Sequence[tuple[str, str | None]],
) -> dict:
    """What each host must find out before the job's variables can be computed: GPUs (only for
    --devices-per-rank without a device list) and its device IPs (only for --rank-table)."""
    return {
        "gpus": bool(per_rank) and not user_device_lists(launcher_env, exports),
        "hccn": os.path.abspath(launcher_env.get("MPILAUNCH_HCCN_CONF") or HCCN_CONF) if rank_table else None,
    }
