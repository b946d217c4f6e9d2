"""torchrun's command line (cli/torchrun_words.py) read through parse_args, as the launcher reads
it: under mpilaunch's name and as `torchrun`, with PET_ variables, and what the console shows
for -r/-t/--local-ranks-filter checked against torch's own DefaultLogsSpecs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mpilaunch.cli.parse import parse_args, python_program
from mpilaunch.cli.torchrun_words import RUN_PATH, std_streams
from mpilaunch.errors import LaunchError
from mpilaunch.plan.spec import JobSpec, TorchRun

PY = (sys.executable, "-u")


@pytest.fixture(autouse=True)
def _no_pet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's own PET_ variables (a torchrun job's environment) would change what is read."""
    for name in list(os.environ):
        if name.startswith("PET_"):
            monkeypatch.delenv(name)


def spec(*words: str, name: str = "mpilaunch") -> JobSpec:
    return parse_args(list(words), name)


def torch_of(*words: str, name: str = "mpilaunch") -> TorchRun:
    found = spec(*words, name=name).options.torch
    assert found is not None, words
    return found


def refused(*words: str, name: str = "mpilaunch") -> str:
    with pytest.raises(LaunchError) as caught:
        spec(*words, name=name)
    text = str(caught.value)
    assert "\n" not in text and caught.value.status == 2, text
    return text


PER_NODE = ("--nnodes", "2", "--node-rank", "1", "--master-addr", "h")


# -- --nproc-per-node --------------------------------------------------------------------------
def test_nproc_per_node_a_number_is_ranks_on_each_host() -> None:
    job = spec("--nproc-per-node", "3", "train.py")
    assert job.options.torch is not None and job.options.torch.nproc_per_node == 3
    assert job.options.npernode == 3  # one launcher, the hosts' ranks: 3 on each
    assert job.apps[0].argv == (*PY, "train.py")


@pytest.mark.parametrize("word", ["auto", "cpu"])
def test_nproc_per_node_auto_and_cpu_are_this_machines_cpus(word: str) -> None:
    assert torch_of("--nproc-per-node", word, "t.py").nproc_per_node == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("value", ["0", "two", "65537", "-1", "\u0663"])
def test_nproc_per_node_other_values_are_refused(value: str) -> None:
    assert refused("--nproc-per-node", value, "t.py") == (
        f"--nproc-per-node {value!r}: expected a number from 1, auto, cpu or gpu"
    )


def test_dash_n_with_nproc_per_node_is_refused_and_dash_n_alone_keeps_its_count() -> None:
    assert refused("-n", "2", "--nproc-per-node", "2", "t.py") == (
        "-n and --nproc-per-node: give one of them (torchrun's is ranks per node)"
    )
    job = spec("-n", "5", "--standalone", "t.py")  # torchrun's words without --nproc-per-node: -n decides
    assert job.apps[0].np == 5 and job.options.npernode is None


# -- --nnodes, --node-rank, --standalone -----------------------------------------------------------
def test_nnodes_min_max_is_a_meeting_that_numbers_the_nodes() -> None:
    assert torch_of("--nnodes", "2:2", "--node-rank", "0", "--master-addr", "h", "t.py").nnodes == 2
    c10d = ("--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29433")
    run = torch_of("--nnodes", "1:4", *c10d, "--node-rank", "3", "t.py")  # torchrun's c10d ignores --node-rank
    assert (run.min_nodes, run.nnodes, run.node_rank, run.endpoint, run.last_call) == (1, 4, None, ("h", 29433), 30.0)
    run = torch_of("--nnodes", "1:2", "--nproc-per-node", "2", "t.py")  # nowhere to meet: this machine's job
    assert (run.nnodes, run.endpoint, spec("--nnodes", "1:2", "--nproc-per-node", "2", "t.py").options.npernode) == (
        1,
        None,
        2,
    )
    run = torch_of("--nnodes", "2:4", "t.py")  # nowhere to meet: one launcher, whose hosts must number 2 to 4
    assert (run.nodes_asked, run.node_rank, run.endpoint, run.min_nodes) == ((2, 4), None, None, 0)
    for bad in ("0", "x", ":2", "2:", "1:2:3", "0:0", "3:2"):
        assert refused("--nnodes", bad, "t.py") == f"--nnodes {bad!r}: expected N or MIN:MAX (MIN <= MAX)", bad


def test_rdzv_conf_sets_the_meetings_timeouts_and_who_serves_it() -> None:
    words = ("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h")
    conf = "join_timeout=60, last_call_timeout=5,is_host=False,read_timeout=9"  # torchrun's other keys: read by none
    run = torch_of(*words, "--rdzv-conf", conf, "t.py")
    assert (run.join_timeout, run.last_call, run.is_host, run.endpoint) == (60.0, 5.0, False, ("h", 29400))
    assert (
        refused(*words, "--rdzv-conf", "is_host=maybe", "t.py") == "--rdzv-conf is_host=maybe: expected true or false"
    )
    assert refused(*words, "--rdzv-conf", "join_timeout=-1", "t.py").startswith("--rdzv-conf join_timeout '-1':")


def test_node_rank_is_one_of_the_nodes() -> None:
    run = torch_of(*PER_NODE, "t.py")
    assert (run.nnodes, run.node_rank, run.endpoint) == (2, 1, ("h", 29500))
    assert refused("--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "t.py") == (
        "--node-rank 2: expected 0 to 1 for --nnodes 2"
    )
    assert refused("--nnodes", "3", "--master-addr", "h", "t.py") == (
        "--nnodes 3 with torchrun's static rendezvous: give this node's --node-rank and a fixed N (or --rdzv-backend "
        "c10d, which numbers the nodes as they meet)"
    )
    assert refused("--nnodes", "2", "--node-rank", "0", "t.py").startswith("--nnodes N: say where the nodes meet")


def test_one_node_is_not_a_launcher_per_node() -> None:
    """--nnodes 1 (or torchrun's default) with a --node-rank: the ranks of one launcher, nothing to meet."""
    run = torch_of("--nnodes", "1", "--node-rank", "0", "--nproc-per-node", "2", "t.py")
    assert (run.nnodes, run.node_rank, run.endpoint) == (1, None, None)


def test_standalone_is_one_node_whatever_nnodes_says() -> None:
    job = spec("--standalone", "--nnodes", "2", "--nproc-per-node", "2", "t.py")
    run = job.options.torch
    assert run is not None and (run.standalone, run.nnodes, run.node_rank, run.endpoint) == (True, 1, None, None)
    assert job.options.npernode == 2 and job.options.mpi == "auto"


# -- rendezvous: backend, endpoint ---------------------------------------------------------------
def test_rdzv_backend_static_and_c10d_are_served_others_refused() -> None:
    for backend in ("static", "c10d", "C10D"):
        assert torch_of("--rdzv-backend", backend, "t.py").nproc_per_node == 1
    for backend in ("etcd", "etcd-v2"):
        assert refused("--rdzv-backend", backend, "t.py") == (
            f"--rdzv-backend {backend}: mpilaunch's launchers meet through a store of their own; use "
            "--rdzv-backend static or c10d (the same here)"
        )


@pytest.mark.parametrize(
    "backend, endpoint, expected",
    [
        ("static", "node0", ("node0", 29500)),
        ("c10d", "node0", ("node0", 29400)),
        ("c10d", "node0:1234", ("node0", 1234)),
        ("static", "10.0.0.1:29501", ("10.0.0.1", 29501)),
        ("c10d", "[::1]:5", ("::1", 5)),  # torch's parse_rendezvous_endpoint drops the brackets
        ("c10d", "[fe80::1]", ("fe80::1", 29400)),
    ],
)
def test_rdzv_endpoint_host_and_port_with_each_backends_default(
    backend: str, endpoint: str, expected: tuple[str, int]
) -> None:
    words = ("--nnodes", "2", "--node-rank", "0", "--rdzv-backend", backend, "--rdzv-endpoint", endpoint, "t.py")
    assert torch_of(*words).endpoint == expected


def test_rdzv_endpoint_port_out_of_range_is_refused() -> None:
    for endpoint in ("node0:0", "node0:70000", ":29500"):
        words = ("--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", endpoint, "t.py")
        assert refused(*words) == f"--rdzv-endpoint {endpoint!r}: expected HOST[:PORT]", endpoint


@pytest.mark.parametrize(
    "endpoint",
    ["localhost:-1", "localhost:", "localhost:abc", "localhost:123456", "ho\udcffst:29400", "a b:29400", "h/x"],
    ids=["negative", "empty", "word", "six-digits", "not-utf8", "blank", "slash"],
)
def test_a_malformed_endpoint_is_refused_before_anything_starts(endpoint: str) -> None:
    """As torch's parse_rendezvous_endpoint refuses it (a port of 1 to 5 digits, a host of
    [\\w.:-]); a port that is not a number is no default port, and a byte that is not UTF-8 (a
    surrogate here, as the command line's bytes are read) is no host to look up."""
    words = ("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "t.py")
    assert refused(*words) == f"--rdzv-endpoint {endpoint!r}: expected HOST[:PORT]"


@pytest.mark.parametrize("where", [("--nnodes", "2", "--node-rank", "1"), ("--nnodes", "1", "--master-port", "29500")])
def test_a_master_address_that_is_no_host_is_refused(where: tuple[str, ...]) -> None:
    assert (
        refused(*where, "--master-addr", "ho\udcffst", "t.py")
        == "--master-addr 'ho\\udcffst': expected a host name or an address"
    )


def test_c10d_without_node_rank_is_numbered_at_the_meeting() -> None:
    """As torchrun's c10d agents: without --node-rank the launchers number the nodes as they meet."""
    run = torch_of("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29400", "t.py", name="torchrun")
    assert (run.nnodes, run.min_nodes, run.node_rank, run.endpoint) == (2, 2, None, ("h", 29400))


def test_master_addr_and_port_and_the_endpoint_before_them() -> None:
    run = torch_of("--nnodes", "2", "--node-rank", "0", "--master-addr", "n0", "--master-port", "6000", "t.py")
    assert run.endpoint == ("n0", 6000)
    words = ("--nnodes", "2", "--node-rank", "0", "--master-addr", "n0", "--rdzv-endpoint", "n1:7000", "t.py")
    assert torch_of(*words).endpoint == ("n1", 7000)


# -- PET_ variables: torchrun's defaults from the environment ----------------------------------------
def test_pet_variables_give_what_the_command_line_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in [
        ("NPROC_PER_NODE", "3"),
        ("NNODES", "2"),
        ("NODE_RANK", "1"),
        ("MASTER_ADDR", "n0"),
        ("MASTER_PORT", "7001"),
        ("RDZV_ID", "job7"),
        ("ROLE", "trainer"),
    ]:
        monkeypatch.setenv(f"PET_{name}", value)
    job = spec("t.py", name="torchrun")
    run = job.options.torch
    assert run is not None
    assert (run.nproc_per_node, run.nnodes, run.node_rank, run.endpoint) == (3, 2, 1, ("n0", 7001))
    assert (run.run_id, run.role, job.options.mpi) == ("job7", "trainer", "none")
    run = torch_of("--nproc-per-node", "2", "--node-rank", "0", "t.py", name="torchrun")  # the line wins
    assert (run.nproc_per_node, run.node_rank) == (2, 0)
    monkeypatch.setenv("PET_NNODES", "1")
    assert spec("t.py").options.torch is None  # mpilaunch's own line: PET_ means nothing


def test_pet_flags_are_numbers_zero_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's check_env: PET_STANDALONE=0 is no --standalone (bool("0") would be one)."""
    monkeypatch.setenv("PET_STANDALONE", "0")
    monkeypatch.setenv("PET_NO_PYTHON", "0")
    job = spec("--nnodes", "2", "--node-rank", "1", "--master-addr", "h", "t.py", name="torchrun")
    run = job.options.torch
    assert run is not None and (run.standalone, run.nnodes, run.node_rank) == (False, 2, 1)
    assert job.apps[0].argv == (*PY, "t.py")
    monkeypatch.setenv("PET_STANDALONE", "1")
    monkeypatch.setenv("PET_NO_PYTHON", "1")
    job = spec("--nnodes", "2", "train", name="torchrun")
    run = job.options.torch
    assert run is not None and (run.standalone, run.nnodes) == (True, 1) and job.apps[0].argv == ("train",)
    monkeypatch.setenv("PET_STANDALONE", "yes")
    assert refused("t.py", name="torchrun") == "PET_STANDALONE='yes': expected 0 or 1"


@pytest.mark.parametrize(
    "name, value, says",
    [
        ("NODE_RANK", "one", "--node-rank 'one': expected a number from 0 to 65536"),
        ("MASTER_PORT", "0", "--master-port '0': expected a number from 1 to 65535"),
        ("MASTER_PORT", "http", "--master-port 'http': expected a number from 1 to 65535"),
        ("NPROC_PER_NODE", "many", "--nproc-per-node 'many': expected a number from 1, auto, cpu or gpu"),
        ("RDZV_BACKEND", "etcd", "--rdzv-backend etcd: mpilaunch's launchers meet through a store"),
        ("REDIRECTS", "9", "--redirects '9': expected 0 to 3"),
    ],
)
def test_a_bad_pet_value_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str
) -> None:
    for other, text in (("NNODES", "2"), ("NODE_RANK", "0"), ("MASTER_ADDR", "n0")):
        monkeypatch.setenv(f"PET_{other}", text)
    monkeypatch.setenv(f"PET_{name}", value)
    assert refused("t.py", name="torchrun").startswith(says)


# -- what runs -----------------------------------------------------------------------------------
def test_module_no_python_and_run_path_rewrite_the_program() -> None:
    assert spec("-m", "--nproc-per-node", "2", "pkg.train", "-m", "x").apps[0].argv == (
        *PY,
        "-m",
        "pkg.train",
        "-m",
        "x",
    )
    assert spec("--no-python", "--nproc-per-node", "1", "echo", "hi").apps[0].argv == ("echo", "hi")
    assert spec("--run-path", "--standalone", "t.py", "a").apps[0].argv == (*PY, "-c", RUN_PATH, "t.py", "a")
    words = ("--nproc-per-node", "2", "t.py", "--", "-n", "3", "--nproc-per-node", "4")
    assert spec(*words).apps[0].argv == (*PY, "t.py", "-n", "3", "--nproc-per-node", "4")


def test_a_py_file_that_is_no_program_runs_with_this_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mpilaunch's own line (`mpilaunch -n 2 ddp.py`): a .py file that cannot be executed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ddp.py").write_text("print(1)\n")
    job = spec("-n", "2", "ddp.py", "--lr", "1")
    assert job.options.torch is None and job.apps[0].argv == (*PY, "ddp.py", "--lr", "1")
    tool = tmp_path / "tool.py"
    tool.write_text("#!/usr/bin/env python3\n")
    tool.chmod(0o755)
    assert spec("-n", "1", "tool.py").apps[0].argv == ("tool.py",)  # executable: a program
    assert spec("-n", "1", "gone.py").apps[0].argv == ("gone.py",)  # no such file: its own error later
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "w.py").write_text("")
    assert spec("-n", "1", "-wdir", str(sub), "w.py").apps[0].argv == (*PY, "w.py")  # looked for in --wdir
    assert spec("-n", "1", "w.py").apps[0].argv == ("w.py",)


def test_a_py_name_on_path_is_a_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cli.py").write_text("#!/bin/sh\n")
    (bin_dir / "cli.py").chmod(0o755)
    (tmp_path / "cli.py").write_text("")  # a plain file of that name here: PATH's program is meant
    monkeypatch.chdir(tmp_path)
    assert python_program(("cli.py",), None) == (*PY, "cli.py")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert python_program(("cli.py", "x"), None) == ("cli.py", "x")
    assert python_program(("./cli.py",), None) == (*PY, "./cli.py")  # a path is never looked up


# -- torchrun's way across nodes: no MPI job -----------------------------------------------------------
def test_one_launcher_per_node_serves_no_mpi_job() -> None:
    job = spec(*PER_NODE, "t.py")
    assert job.options.mpi == "none" and job.options.npernode is None
    assert spec(*PER_NODE, "--mpi", "none", "t.py").options.mpi == "none"
    said = refused(*PER_NODE, "--mpi", "pmix", "t.py")
    assert said.startswith("--mpi pmix with torchrun's one launcher per node (--nnodes/--node-rank)")
    assert spec("--nproc-per-node", "2", "--mpi", "pmix", "t.py").options.mpi == "pmix"  # one launcher: served


def test_the_name_torchrun_is_torchrun_without_its_words() -> None:
    job = spec("t.py", name="torchrun")
    run = job.options.torch
    assert run is not None and (run.nproc_per_node, run.nnodes, run.node_rank) == (1, 1, None)
    assert job.options.npernode == 1 and job.apps[0].argv == (*PY, "t.py")
    assert torch_of("--nproc-per-node", "2", "t.py").nnodes is None  # mpilaunch's: the hosts decide
    assert spec("t.py").options.torch is None


def test_log_dir_is_the_output_tree_unless_output_filename_is_given() -> None:
    assert spec("--nproc-per-node", "1", "--log-dir", "logs", "t.py").options.output_filename == "logs"
    words = ("--nproc-per-node", "1", "--log-dir", "logs", "--output-filename", "out", "t.py")
    assert spec(*words).options.output_filename == "out"


def test_ignored_torchrun_options_give_a_note() -> None:
    job = spec("--nproc-per-node", "1", "--signals-to-handle", "SIGUSR1", "--numa-binding", "node", "t.py")
    assert job.options.notes == (
        "torchrun's --numa-binding means nothing here: ignored",
        "torchrun's --signals-to-handle means nothing here: ignored",
    )
    assert spec("--nproc-per-node", "1", "t.py").options.notes == ()


def test_the_run_id_is_torchruns_rdzv_id_or_none_unless_it_makes_its_own_rendezvous() -> None:
    """As torchrun 2.13: --rdzv-id, else `none`, the same on every node; a fresh id ("": the
    job's) where torchrun starts a rendezvous of its own on a free port, whatever --rdzv-id says."""
    node = ("--nnodes", "2", "--node-rank", "1", "--master-addr", "h")
    assert torch_of(*node, "t.py").run_id == "none"
    assert torch_of(*node, "--rdzv-id", "abc", "t.py").run_id == "abc"
    assert torch_of(*node, "--rdzv-backend", "c10d", "--rdzv-id", "abc", "t.py").run_id == "abc"
    assert torch_of("--master-port", "29600", "--rdzv-id", "abc", "t.py").run_id == "abc"
    assert torch_of("--master-port", "29600", "t.py").run_id == "none"
    for fresh in (("--standalone",), ("--nnodes", "1"), ()):
        assert torch_of(*fresh, "--nproc-per-node", "2", "--rdzv-id", "abc", "t.py").run_id == ""


# -- -r, -t, --local-ranks-filter ----------------------------------------------------------------------
def test_std_streams_reads_one_mask_or_one_per_local_rank() -> None:
    assert std_streams("--redirects", "3") == ((-1, 3),)
    assert std_streams("--tee", "0:1,1:2") == ((0, 1), (1, 2))
    assert std_streams("--tee", " 0:3 , 12:1 ") == ((0, 3), (12, 1))
    assert std_streams("--tee", "") == std_streams("--tee", None) == ()
    for bad in ("4", "a", "0:4", "0:", ":1", "0:1,,1:2", "-1", "0=1"):
        with pytest.raises(LaunchError) as caught:
            std_streams("--redirects", bad)
        assert str(caught.value) == (
            f"--redirects {bad!r}: expected 0 to 3 (none, stdout, stderr, both) or LOCAL_RANK:0-3,..."
        )


def test_local_ranks_filter_is_local_ranks() -> None:
    assert torch_of("--local-ranks-filter", "0,2", "--standalone", "t.py").local_ranks_filter == (0, 2)
    assert refused("--local-ranks-filter", "0,a", "--standalone", "t.py") == (
        "--local-ranks-filter '0,a': expected local ranks, comma separated (0,1,2)"
    )


REDIRECTS = ["", "0", "1", "2", "3", "0:3,2:1", "1:2"]
TEES = ["", "1", "2", "3", "0:2,1:1"]
FILTERS = ["", "1", "0,2"]


def _torchs_console(
    tmp: Path, redirects: str, tee: str, ranks_filter: str, nprocs: int
) -> tuple[list[int], bool, list[int]]:
    """What torch 2.13's torchrun shows on its console for each local rank (1 stdout, 2 stderr),
    whether it writes any stream to a file, and which shown streams it tails from their files
    (labelled `[default0]:`): its DefaultLogsSpecs decides all three."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std

    logs = DefaultLogsSpecs(
        log_dir=str(tmp),
        redirects=Std.from_str(redirects or "0"),
        tee=Std.from_str(tee or "0"),
        local_ranks_filter={int(r) for r in ranks_filter.split(",")} if ranks_filter else None,
    )
    dest = logs.reify({r: {"TORCHELASTIC_RUN_ID": "run", "TORCHELASTIC_RESTART_COUNT": "0"} for r in range(nprocs)})
    shown, labelled = [], []
    for rank in range(nprocs):
        teed = [dest.tee_stdouts.get(rank, os.devnull), dest.tee_stderrs.get(rank, os.devnull)]
        labelled.append(int(teed[0] != os.devnull) | 2 * int(teed[1] != os.devnull))
        out = dest.stdouts[rank] == "" or dest.tee_stdouts.get(rank, os.devnull) != os.devnull
        err = dest.stderrs[rank] == "" or dest.tee_stderrs.get(rank, os.devnull) != os.devnull
        shown.append(int(out) | 2 * int(err))
    paths = [*dest.stdouts.values(), *dest.stderrs.values()]
    return shown, any(p not in ("", os.devnull) for p in paths), labelled


def test_on_console_and_to_files_agree_with_torchrun_for_every_combination(tmp_path: Path) -> None:
    nprocs = 3
    checked = 0
    for redirects in REDIRECTS:
        for tee in TEES:
            for ranks_filter in FILTERS:
                words = ["--nproc-per-node", str(nprocs)]
                words += ["-r", redirects] if redirects else []
                words += ["-t", tee] if tee else []
                words += ["--local-ranks-filter", ranks_filter] if ranks_filter else []
                run = torch_of(*words, "t.py")
                shown, files, labelled = _torchs_console(tmp_path / str(checked), redirects, tee, ranks_filter, nprocs)
                assert [run.on_console(r) for r in range(nprocs)] == shown, words
                ours = [
                    int(bool(run.console_label(r, 1))) | 2 * int(bool(run.console_label(r, 2))) for r in range(nprocs)
                ]
                assert ours == labelled, words
                assert run.to_files == files, words
                checked += 1
    assert checked == len(REDIRECTS) * len(TEES) * len(FILTERS)


def test_on_console_cases_by_hand() -> None:
    """The combinations above, spelled out: what each word takes off or puts back."""
    run = TorchRun(nproc_per_node=2)
    assert [run.on_console(r) for r in (0, 1)] == [3, 3] and not run.to_files
    run = TorchRun(nproc_per_node=2, redirects=((-1, 3),))
    assert [run.on_console(r) for r in (0, 1)] == [0, 0] and run.to_files
    run = TorchRun(nproc_per_node=2, redirects=((-1, 3),), tee=((1, 2),))
    assert [run.on_console(r) for r in (0, 1)] == [0, 2]
    run = TorchRun(nproc_per_node=2, redirects=((0, 1),))  # rank 0's stdout only
    assert [run.on_console(r) for r in (0, 1)] == [2, 3]
    run = TorchRun(nproc_per_node=2, tee=((-1, 3),), local_ranks_filter=(1,))
    assert [run.on_console(r) for r in (0, 1)] == [0, 3] and run.to_files
    run = TorchRun(nproc_per_node=2, redirects=((-1, 0),), tee=((-1, 0),))
    assert not run.to_files


def test_torchruns_graces_before_sigkill(monkeypatch: pytest.MonkeyPatch) -> None:
    """30 s after a failure and after a signal; --shutdown-timeout (PET_, TORCH_ELASTIC_SHUTDOWN_TIMEOUT)
    the latter only, as torchrun 2.13; --kill-timeout both; mpirun's words keep theirs."""
    graces = lambda *w: (spec(*w, "t.py").options.kill_timeout, spec(*w, "t.py").options.signal_grace)  # noqa: E731
    assert graces("--nproc-per-node", "2") == (30.0, 30.0)
    assert graces("--nproc-per-node", "2", "--shutdown-timeout", "5") == (30.0, 5.0)
    assert graces("--nproc-per-node", "2", "--kill-timeout", "4") == (4.0, 4.0)
    assert graces("--nproc-per-node", "2", "--kill-timeout", "4", "--shutdown-timeout", "0") == (4.0, 0.0)
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7")
    assert graces("--nproc-per-node", "2") == (30.0, 7.0)
    monkeypatch.setenv("PET_SHUTDOWN_TIMEOUT", "8")
    assert graces("--nproc-per-node", "2") == (30.0, 8.0)
    assert (spec("-n", "2", "t").options.kill_timeout, spec("-n", "2", "t").options.signal_grace) == (2.0, None)
    said = refused("--shutdown-timeout", "soon", "t.py")
    assert said == "--shutdown-timeout 'soon': expected a number from 0 to 3600"


def test_a_double_dash_right_after_the_script_is_dropped_as_torchrun_does() -> None:
    assert spec("--nproc-per-node", "1", "x.py", "--", "--lr", "1").apps[0].argv == (*PY, "x.py", "--lr", "1")
    assert spec("--nproc-per-node", "1", "-m", "pkg", "--", "a", "--").apps[0].argv == (*PY, "-m", "pkg", "a", "--")
    assert spec("--nproc-per-node", "1", "--no-python", "echo", "--", "a").apps[0].argv == ("echo", "a")
    assert spec("-n", "1", "echo", "--", "a").apps[0].argv == ("echo", "--", "a")  # mpirun's words: as given


def test_open_mpis_pernode_gives_way_to_nproc_per_node_as_n_does() -> None:
    """--pernode with --nproc-per-node: torchrun's ranks per node win, as over -N 1 (before: a
    traceback, two values for one option)."""
    pernode = parse_args(["--nproc-per-node", "2", "--pernode", "t.py"])
    assert pernode.options.npernode == 2
    assert pernode == parse_args(["--nproc-per-node", "2", "-N", "1", "t.py"])
