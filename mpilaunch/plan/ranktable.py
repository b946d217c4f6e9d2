"""The HCCL rank table (MindSpore / Ascend `rank_table_8pcs.json`) of a job's placement.

Every value is a string, as in MindSpore's samples; servers come in node order with their
devices in rank order. `device_id` is the device's number on its host, `device_ip` its IP in
that host's /etc/hccn.conf (`address_N=IP`), `server_id` the address the host is reached at.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from mpilaunch.plan.devices import job_device_lists, physical_device, user_device_lists
from mpilaunch.plan.hosts import Host
from mpilaunch.plan.placement import Rank

Device = tuple[str, str, int]  # (device_id, device_ip, rank_id)


def build_rank_table(servers: Sequence[tuple[str, Sequence[Device]]]) -> dict:
    """The table as MindSpore reads it, from (server_id, [(device_id, device_ip, rank_id)])."""
    return {
        "version": "1.0",
        "server_count": str(len(servers)),
        "server_list": [
            {
                "server_id": server_id,
                "device": [
                    {"device_id": str(device), "device_ip": ip, "rank_id": str(rank)} for device, ip, rank in devices
                ],
                "host_nic_ip": "reserve",
            }
            for server_id, devices in servers
        ],
        "status": "completed",
    }


def format_rank_table(table: Mapping) -> str:
    """JSON laid out as MindSpore's sample files are: one device per line."""

    def s(value: object) -> str:
        return json.dumps(value, ensure_ascii=False)

    servers = []
    for server in table["server_list"]:
        devices = ",\n".join(
            "                {" + ",".join(f"{s(k)}: {s(v)}" for k, v in device.items()) + "}"
            for device in server["device"]
        )
        servers.append(
            "        {\n"
            f'            "server_id": {s(server["server_id"])},\n'
            f'            "device": [\n{devices}],\n'
            f'            "host_nic_ip": {s(server["host_nic_ip"])}\n'
            "        }"
        )
    return (
        "{\n"
        f'    "version": {s(table["version"])},\n'
        f'    "server_count": {s(table["server_count"])},\n'
        '    "server_list": [\n' + ",\n".join(servers) + "\n    ],\n"
        f'    "status": {s(table["status"])}\n'
        "}\n"
    )


def job_rank_table(
    ranks: Sequence[Rank],
    hosts: Sequence[Host],
    host_info: Mapping[int, Mapping],
    *,
    per_rank: int | None,
    launcher_env: Mapping[str, str],
    exports: Sequence[tuple[str, str | None]],
) -> tuple[dict, list[str]]:
    """The rank table of job 1 and notes for the user (missing device IPs, an order HCCL may
    not accept). host_info[i] may hold "address" (server_id) and "hccn" (hostinfo.read_hccn)."""
    lists = job_device_lists(ranks, hosts, host_info, per_rank, user_device_lists(launcher_env, exports))
    devices: dict[int, list[Device]] = {}  # by host, the hosts in the order of their first rank
    for rank in sorted(ranks, key=lambda r: r.rank):
        device = physical_device(rank.local_rank, per_rank, lists[rank.host])
        ips = host_info.get(rank.host, {}).get("hccn", {}).get("addresses", {})
        devices.setdefault(rank.host, []).append((device, ips.get(device, ""), rank.rank))
    order = list(devices)
    servers = [(str(host_info.get(h, {}).get("address") or hosts[h].name), devices[h]) for h in order]
    return build_rank_table(servers), rank_table_notes(servers, [hosts[h].name for h in order], host_info, order)


def rank_table_notes(
    servers: Sequence[tuple[str, Sequence[Device]]],
    names: Sequence[str],
    host_info: Mapping[int, Mapping],
    order: Sequence[int],
) -> list[str]:
    """What HCCL may trip over: device IPs not found, rank ids that do not follow the servers."""
    notes = []
    for (_, devices), name, index in zip(servers, names, order):
        hccn = host_info.get(index, {}).get("hccn", {})
        missing = [d for d, ip, _ in devices if not ip]
        if hccn.get("error"):
            notes.append(f"{name}: {hccn['error']}; device_ip left empty")
        elif missing:
            notes.append(f"{name}: no address_N for device(s) {','.join(missing)} in hccn.conf; device_ip left empty")
    ranks = [rank for _, devices in servers for _, _, rank in devices]
    if ranks != sorted(ranks):
        notes.append("each server's rank ids are not consecutive (HCCL expects them so); use --map-by slot")
    ids = [server_id for server_id, _ in servers]
    if ids != sorted(ids):
        notes.append(
            "server_ids are not in lexicographic order (MindSpore expects rank ids to follow it); "
            "list the hosts in that order"
        )
    return notes
