"""Devices, threads and the rank table: the pure functions (devices, ranktable, hostinfo).

End-to-end runs with real ranks, and the GPUs counted by running nvidia-smi, are in
tests/local/test_devices_run.py; over SSH in test_clients_ssh.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mpilaunch.cli.parse import parse_args
from mpilaunch.errors import LaunchError
from mpilaunch.host import files, hostinfo
from mpilaunch.plan import devices
from mpilaunch.plan.hosts import Host
from mpilaunch.plan.placement import place
from mpilaunch.plan.ranktable import build_rank_table, format_rank_table, job_rank_table
from tests.conftest import SEED_IPS

# MindSpore's rank_table_8pcs.json as the seed (MindSpore r1.7 "train_ascend") shows it.
SAMPLE_8PCS = """{ "version": "1.0", "server_count": "1", "server_list": [ { "server_id": "10.*.*.*", "device": [
{"device_id": "0","device_ip": "192.1.27.6","rank_id": "0"},
{"device_id": "1","device_ip": "192.2.27.6","rank_id": "1"},
{"device_id": "2","device_ip": "192.3.27.6","rank_id": "2"},
{"device_id": "3","device_ip": "192.4.27.6","rank_id": "3"},
{"device_id": "4","device_ip": "192.1.27.7","rank_id": "4"},
{"device_id": "5","device_ip": "192.2.27.7","rank_id": "5"},
{"device_id": "6","device_ip": "192.3.27.7","rank_id": "6"},
{"device_id": "7","device_ip": "192.4.27.7","rank_id": "7"}],
"host_nic_ip": "reserve" } ], "status": "completed" }"""
SEED_16_SECOND = ["192.1.27.8", "192.2.27.8", "192.3.27.8", "192.4.27.8"]
SEED_16_SECOND += ["192.1.27.9", "192.2.27.9", "192.3.27.9", "192.4.27.9"]


def words(text: str) -> list[str]:
    return text.split()


def ranks_of(hosts: list[Host], np: int, map_by: str = "slot"):  # -> list[Rank]
    return place(hosts, [(np, "python")], map_by, None, False)


# -- device lists -------------------------------------------------------------------------------


def test_device_lists_are_split_on_commas_and_kept_as_strings() -> None:
    assert devices.parse_device_list("2,3") == ["2", "3"]
    assert devices.parse_device_list(" 0, 1 ,") == ["0", "1"]
    assert devices.parse_device_list("GPU-8f1c,MIG-1") == ["GPU-8f1c", "MIG-1"]
    assert devices.parse_device_list("") == []


def test_the_users_lists_come_from_x_first_then_the_launchers_environment() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "0", "OTHER": "x"}
    assert devices.user_device_lists(env, ()) == {"CUDA_VISIBLE_DEVICES": ["2", "3"], "HIP_VISIBLE_DEVICES": ["0"]}
    exports = (("CUDA_VISIBLE_DEVICES", "4,5,6"), ("ASCEND_RT_VISIBLE_DEVICES", None))
    assert devices.user_device_lists(env, exports) == {
        "CUDA_VISIBLE_DEVICES": ["4", "5", "6"],
        "HIP_VISIBLE_DEVICES": ["0"],
    }
    ascend = {"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert devices.user_device_lists(ascend, (("ASCEND_RT_VISIBLE_DEVICES", None),)) == {
        "ASCEND_RT_VISIBLE_DEVICES": [str(i) for i in range(8)]
    }
    assert devices.user_device_lists({}, ()) == {}


def test_a_host_uses_the_users_list_else_counted_gpus_else_zero_to_n_minus_one() -> None:
    user = {"CUDA_VISIBLE_DEVICES": ["2", "3", "5"]}
    assert devices.host_device_lists("a", 3, 1, user, {"count": 8}) == user
    assert devices.host_device_lists("a", 2, 2, {}, {"count": 4}) == {"CUDA_VISIBLE_DEVICES": ["0", "1", "2", "3"]}
    assert devices.host_device_lists("a", 2, 2, {}, {"count": 6})["CUDA_VISIBLE_DEVICES"] == list("012345")
    assert devices.host_device_lists("a", 2, 2, {}, None) == {"CUDA_VISIBLE_DEVICES": ["0", "1", "2", "3"]}
    failed = {"count": None, "error": "nvidia-smi -L failed: no driver"}
    assert devices.host_device_lists("a", 1, 3, {}, failed) == {"CUDA_VISIBLE_DEVICES": ["0", "1", "2"]}


def test_too_few_devices_is_a_clear_error_with_status_2() -> None:
    with pytest.raises(LaunchError) as info:
        devices.host_device_lists("localhost", 2, 2, {"CUDA_VISIBLE_DEVICES": ["2", "3"]}, None)
    assert info.value.status == 2
    assert str(info.value) == (
        "--devices-per-rank 2: localhost runs 2 ranks of the job, which need 4 devices; "
        "CUDA_VISIBLE_DEVICES=2,3 lists 2"
    )
    with pytest.raises(LaunchError, match=r"node1 runs 3 ranks of the job, which need 3 devices; nvidia-smi -L on "
                       r"node1 counts 2"):  # fmt: skip
        devices.host_device_lists("node1", 3, 1, {}, {"count": 2})
    with pytest.raises(LaunchError, match="1 rank of the job, which need 1 devices; HIP_VISIBLE_DEVICES= lists 0"):
        devices.host_device_lists("h", 1, 1, {"HIP_VISIBLE_DEVICES": []}, None)


def test_each_local_rank_gets_its_slice_and_its_physical_device() -> None:
    listed = ["2", "3", "4", "5"]
    assert [devices.rank_slice(listed, i, 2) for i in range(2)] == [["2", "3"], ["4", "5"]]
    assert [devices.rank_slice(listed, i, 1) for i in range(4)] == [["2"], ["3"], ["4"], ["5"]]
    lists = {"CUDA_VISIBLE_DEVICES": listed}
    assert [devices.physical_device(i, 2, lists) for i in range(2)] == ["2", "4"]
    assert [devices.physical_device(i, None, lists) for i in range(4)] == listed
    assert devices.physical_device(5, None, lists) == "5"  # past the list: the local rank
    assert devices.physical_device(3, None, {}) == "3"


def test_omp_threads_share_the_cpus_at_least_one() -> None:
    assert devices.omp_threads(2, 2) == 1
    assert devices.omp_threads(2, 4) == 1
    assert devices.omp_threads(8, 3) == 2
    assert devices.omp_threads(64, 8) == 8
    assert devices.omp_threads(4, 1) == 4


# -- per rank variables -------------------------------------------------------------------------


def extras(hosts, ranks, info, per_rank=None, table=None, env=None, exports=()):  # -> list[dict]
    return devices.rank_extras(
        ranks, hosts, info, per_rank=per_rank, rank_table=table, launcher_env=env or {}, exports=exports
    )


def test_cuda_visible_devices_2_3_with_one_device_per_rank() -> None:
    """The issue's example: CUDA_VISIBLE_DEVICES=2,3 mpilaunch -n 2 --devices-per-rank 1."""
    hosts = [Host("localhost", 2)]
    got = extras(hosts, ranks_of(hosts, 2), {0: {"cpus": 2}}, 1, env={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert got == [
        {"CUDA_VISIBLE_DEVICES": "2", "DEVICE_ID": "0", "OMP_NUM_THREADS": "1"},
        {"CUDA_VISIBLE_DEVICES": "3", "DEVICE_ID": "0", "OMP_NUM_THREADS": "1"},
    ]


def test_slices_per_host_with_counted_gpus_and_map_by_node() -> None:
    hosts = [Host("a", 4), Host("b", 4)]
    info = {0: {"cpus": 16, "gpus": {"count": 8}}, 1: {"cpus": 8, "gpus": {"count": 4}}}
    got = extras(hosts, ranks_of(hosts, 4, "node"), info, 2)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in got] == ["0,1", "0,1", "2,3", "2,3"]
    assert [e["OMP_NUM_THREADS"] for e in got] == ["8", "4", "8", "4"]
    assert {e["DEVICE_ID"] for e in got} == {"0"}
    with pytest.raises(LaunchError, match="b runs 2 ranks of the job, which need 6 devices; nvidia-smi -L on b counts"):
        extras(hosts, ranks_of(hosts, 4, "node"), info, 3)


def test_every_list_the_user_set_is_narrowed_and_x_wins_except_over_the_lists() -> None:
    hosts = [Host("localhost", 2)]
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "HIP_VISIBLE_DEVICES": "4,5", "OMP_NUM_THREADS": "3"}
    exports = (("DEVICE_ID", "7"), ("CUDA_VISIBLE_DEVICES", "6,7"), ("RANK_TABLE_FILE", "/mine.json"))
    got = extras(hosts, ranks_of(hosts, 2), {0: {"cpus": 2}}, 1, "/t.json", env, exports)
    assert got == [
        {"CUDA_VISIBLE_DEVICES": "6", "HIP_VISIBLE_DEVICES": "4", "OMP_NUM_THREADS": "3"},
        {"CUDA_VISIBLE_DEVICES": "7", "HIP_VISIBLE_DEVICES": "5", "OMP_NUM_THREADS": "3"},
    ]


def test_without_devices_per_rank_only_threads_and_the_rank_table_are_set() -> None:
    hosts = [Host("localhost", 3), Host("node1", 2)]
    ranks = ranks_of(hosts, 5)
    got = extras(hosts, ranks, {0: {"cpus": 2}}, None, "/t.json", {"CUDA_VISIBLE_DEVICES": "2,3"})
    assert got[:3] == [{"OMP_NUM_THREADS": "1", "RANK_TABLE_FILE": "/t.json"}] * 3
    assert got[3:] == [{"RANK_TABLE_FILE": "/t.json"}] * 2  # node1's CPUs are not known (yet)
    # the launcher's own value is the user's choice for every rank, on every host; -x's is already set
    mine = extras(hosts, ranks, {0: {"cpus": 2}}, None, None, {"OMP_NUM_THREADS": "4"})
    assert mine == [{"OMP_NUM_THREADS": "4"}] * 5
    assert extras(hosts, ranks, {0: {"cpus": 2}}, exports=(("OMP_NUM_THREADS", "4"),)) == [{}] * 5


def test_the_omp_note_is_said_once_and_only_when_a_host_runs_several_ranks() -> None:
    hosts = [Host("localhost", 2)]
    ranks = ranks_of(hosts, 2)
    info = {0: {"cpus": 2}}
    envs = extras(hosts, ranks, info)
    assert (
        devices.omp_note(ranks, hosts, envs, info, {}, ())
        == "OMP_NUM_THREADS=1 per rank (2 CPUs, 2 ranks); set it to choose"
    )
    one = ranks_of(hosts, 1)
    assert devices.omp_note(one, hosts, extras(hosts, one, info), info, {}, ()) is None
    assert devices.omp_note(ranks, hosts, [{}, {}], info, {}, ()) is None
    mine = [{"OMP_NUM_THREADS": "1"}] * 2
    assert devices.omp_note(ranks, hosts, mine, info, {"OMP_NUM_THREADS": "1"}, ()) is None
    assert devices.omp_note(ranks, hosts, mine, info, {}, (("OMP_NUM_THREADS", "1"),)) is None
    two = [Host("a", 2), Host("b", 4)]
    ranks = ranks_of(two, 6)
    info2 = {0: {"cpus": 2}, 1: {"cpus": 8}}
    note = devices.omp_note(ranks, two, extras(two, ranks, info2), info2, {}, ())
    assert note == "OMP_NUM_THREADS=1 on a, 2 on b; set it to choose"


def test_the_options_parse() -> None:
    opts = parse_args("--devices-per-rank 2 --rank-table rt.json python t.py".split()).options
    assert opts.devices_per_rank == 2 and opts.rank_table == "rt.json"
    assert parse_args(["-devices-per-rank", "1", "x"]).options.devices_per_rank == 1
    with pytest.raises(LaunchError, match="devices-per-rank"):
        parse_args(["--devices-per-rank", "0", "x"])


def test_what_hosts_are_asked() -> None:
    assert devices.probe_request(None, None, {}, ()) == {"gpus": False, "hccn": None}
    assert devices.probe_request(2, None, {}, ()) == {"gpus": True, "hccn": None}
    assert devices.probe_request(2, None, {"CUDA_VISIBLE_DEVICES": "0"}, ())["gpus"] is False
    assert devices.probe_request(None, "/t", {}, ())["hccn"] == "/etc/hccn.conf"
    assert devices.probe_request(None, "/t", {"MPILAUNCH_HCCN_CONF": "/x"}, ())["hccn"] == "/x"


# -- what a host says about itself (hostinfo: stdlib, also run by remote agents) -----------------


def test_device_ips_come_from_hccn_conf(tmp_path: Path) -> None:
    text = "address_0=192.1.27.6\nnetmask_0=255.255.255.0\naddress_1 = 192.2.27.6\n# address_2=1.1.1.1\n"
    text += "address_07=9.9.9.9\n"
    assert hostinfo.parse_hccn(text) == {"0": "192.1.27.6", "1": "192.2.27.6", "7": "9.9.9.9"}
    conf = tmp_path / "hccn.conf"
    conf.write_text(text)
    assert hostinfo.read_hccn(str(conf))["addresses"]["1"] == "192.2.27.6"
    assert hostinfo.read_hccn(str(tmp_path / "no.conf")) == {
        "error": f"cannot read {tmp_path / 'no.conf'}: No such file or directory"
    }


def test_files_are_replaced_whole_and_errors_say_why(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "rt.json"
    assert files.write_file(str(target), "one") is None
    assert files.write_file(str(target), "two") is None
    assert target.read_text() == "two" and os.listdir(target.parent) == ["rt.json"]
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert files.write_file(str(blocker / "rt.json"), "x") == f"cannot write {blocker / 'rt.json'}: File exists"


# -- the rank table -----------------------------------------------------------------------------


def test_the_8pcs_sample_is_rebuilt_exactly() -> None:
    table = build_rank_table([("10.*.*.*", [(str(i), ip, i) for i, ip in enumerate(SEED_IPS)])])
    assert table == json.loads(SAMPLE_8PCS)
    text = format_rank_table(table)
    assert json.loads(text) == table
    assert words(text) == words(SAMPLE_8PCS)  # the same text, but for line breaks and indentation


def test_the_16pcs_layout_two_servers() -> None:
    servers = [
        ("10.0.0.1", [(str(i), ip, i) for i, ip in enumerate(SEED_IPS)]),
        ("10.0.0.2", [(str(i), ip, i + 8) for i, ip in enumerate(SEED_16_SECOND)]),
    ]
    table = json.loads(format_rank_table(build_rank_table(servers)))
    assert table["server_count"] == "2"
    assert [d["rank_id"] for d in table["server_list"][1]["device"]] == [str(r) for r in range(8, 16)]
    assert table["server_list"][1]["device"][7] == {"device_id": "7", "device_ip": "192.4.27.9", "rank_id": "15"}
    assert all(s["host_nic_ip"] == "reserve" for s in table["server_list"]) and table["status"] == "completed"


def table_of(hosts, ranks, info, per_rank=None, env=None):  # -> tuple[dict, list[str]]
    return job_rank_table(ranks, hosts, info, per_rank=per_rank, launcher_env=env or {}, exports=())


def test_a_job_on_8_devices_gives_the_sample() -> None:
    hosts = [Host("localhost", 8)]
    info = {0: {"address": "10.*.*.*", "hccn": {"addresses": {str(i): ip for i, ip in enumerate(SEED_IPS)}}}}
    table, notes = table_of(hosts, ranks_of(hosts, 8), info)
    assert table == json.loads(SAMPLE_8PCS) and notes == []


def test_the_table_follows_the_devices_each_rank_uses() -> None:
    hosts = [Host("node1", 2), Host("node2", 2)]
    info = {
        0: {"address": "10.0.0.1", "hccn": {"addresses": {"2": "192.3.27.6", "3": "192.4.27.6", "5": "x"}}},
        1: {"address": "10.0.0.2", "hccn": {"addresses": {"2": "192.3.27.8", "3": "192.4.27.8"}}},
    }
    env = {"ASCEND_RT_VISIBLE_DEVICES": "2,3"}
    table, notes = table_of(hosts, ranks_of(hosts, 4), info, env=env)
    assert [(s["server_id"], [(d["device_id"], d["device_ip"], d["rank_id"]) for d in s["device"]])
            for s in table["server_list"]] == [
        ("10.0.0.1", [("2", "192.3.27.6", "0"), ("3", "192.4.27.6", "1")]),
        ("10.0.0.2", [("2", "192.3.27.8", "2"), ("3", "192.4.27.8", "3")]),
    ]  # fmt: skip
    assert notes == []
    hosts = [Host("node1", 4)]
    table, _ = table_of(hosts, ranks_of(hosts, 2), {}, per_rank=2)  # each rank: the first of its two devices
    assert [d["device_id"] for d in table["server_list"][0]["device"]] == ["0", "2"]
    assert table["server_list"][0]["server_id"] == "node1"  # not reached (a dry run): its name


def test_notes_on_what_hccl_may_refuse() -> None:
    hosts = [Host("b", 2), Host("a", 2)]
    info = {
        0: {"address": "10.0.0.2", "hccn": {"addresses": {"0": "1.1.1.1"}}},
        1: {"address": "10.0.0.1", "hccn": {"error": "cannot read /etc/hccn.conf: No such file or directory"}},
    }
    _, notes = table_of(hosts, ranks_of(hosts, 4, "node"), info)
    assert notes == [
        "b: no address_N for device(s) 1 in hccn.conf; device_ip left empty",
        "a: cannot read /etc/hccn.conf: No such file or directory; device_ip left empty",
        "each server's rank ids are not consecutive (HCCL expects them so); use --map-by slot",
        "server_ids are not in lexicographic order (MindSpore expects rank ids to follow it); list the hosts in that "
        "order",
    ]
