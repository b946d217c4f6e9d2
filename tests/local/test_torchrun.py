"""torchrun's users switch without changing a word (issue 29), with real torch 2.13 (CPU, gloo).

Each test runs what a torchrun user types, under mpilaunch's name, as `torchrun` (the shim
`mpilaunch shims` writes) and, where the comparison is the point, under torchrun itself.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, Launcher, write_script

HANG = 180.0  # a guard against a hang, never a measure
# Ports and run ids are the launcher's to choose; the error file's path is where each keeps it.
THEIRS = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}

ENV_DUMP = """
import json, os, sys
import torch.distributed as dist
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as out:
    json.dump({"env": dict(os.environ), "elastic": dist.is_torchelastic_launched()}, out)
"""

RECORD = """
import os
from torch.distributed.elastic.multiprocessing.errors import record

def load(shard):
    raise ValueError(f"bad shard {shard}")

@record
def main():
    if os.environ["RANK"] == "1":
        load(7)

if __name__ == "__main__":
    main()
"""

DDP = """
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
gathered = [torch.zeros(1) for _ in range(world)]
dist.all_gather(gathered, torch.tensor([float(rank)]))
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.full((8, 4), float(rank))).sum().backward()  # different data on every rank
optimizer.step()
weights = [round(float(w), 6) for w in torch.cat([p.detach().flatten() for p in model.parameters()])]
print(json.dumps({"rank": rank, "world": world, "gathered": [float(g) for g in gathered], "weights": weights}),
      flush=True)
if sys.argv[1:] == ["stay"]:
    print("ready", flush=True)
    time.sleep(600)
dist.barrier()  # every rank is done with gloo
# Then leave at once, as examples/ddp_cpu.py does: gloo's teardown now and then aborted a rank
# that had passed this barrier ("terminate called without an active exception", SIGABRT).
sys.stdout.flush()
os._exit(0)
"""

FLAKY = """
import os, sys
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print("attempt", attempt, "rank", os.environ["RANK"], "port", os.environ["MASTER_PORT"], flush=True)
if sys.argv[1] == "always" or (sys.argv[1] == "once" and attempt == 0 and os.environ["RANK"] == "1"):
    sys.exit(3)
"""

FLAKY_DDP = """
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), dist.get_rank()
print("attempt", attempt, "rank", rank, "of", dist.get_world_size(), flush=True)
dist.barrier()
dist.destroy_process_group()
sys.exit(3 if attempt == 0 and rank == 3 else 0)
"""


def shims(launcher: Launcher, tmp_path: Path) -> str:
    """A directory with mpilaunch's shims (torchrun among them), first on a PATH for the test."""
    folder = tmp_path / "shims"
    proc = launcher.run("shims", str(folder))
    assert proc.returncode == 0, proc.stderr.decode()
    return str(folder)


def dumps(folder: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in folder.glob("*.json")}


def added(rank_env: dict[str, str], parent: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in rank_env.items() if parent.get(k) != v}


def _default_sigint() -> None:
    """As from a terminal (a test run in the background hands its children SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dumped(name: str, argv: list[str], env: dict, tmp_path: Path) -> dict:
    """Each rank's ENV_DUMP record of one run of argv (a launcher, its words and the script),
    which must succeed; its folder is named after the launcher."""
    out = tmp_path / name
    out.mkdir()
    proc = subprocess.run(
        [*argv, str(out)], env=env, cwd=tmp_path, capture_output=True, timeout=HANG, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, (name, proc.stderr.decode()[-3000:])
    return dumps(out)


def test_each_rank_gets_torchruns_variables_with_torchruns_values(launcher: Launcher, tmp_path: Path) -> None:
    """torchrun, `mpilaunch --nproc-per-node 2` and the torchrun shim: every variable torchrun
    gives a rank, mpilaunch gives too, with the same value (but ports, run ids, file paths)."""
    script = write_script(tmp_path, "env_dump.py", ENV_DUMP)
    parent = {**launcher.env, "PYTHONPATH": str(ROOT)}
    runs = {}
    for name, argv in (
        ("torchrun", [sys.executable, "-m", "torch.distributed.run"]),
        ("mpilaunch", launcher.argv()),
        ("shim", [os.path.join(shims(launcher, tmp_path), "torchrun")]),
    ):
        runs[name] = _dumped(name, [*argv, "--nproc-per-node", "2", script], parent, tmp_path)
        assert sorted(runs[name]) == [0, 1], name
    for rank in (0, 1):
        theirs = added(runs["torchrun"][rank]["env"], parent)
        assert {"TORCHELASTIC_RUN_ID", "ROLE_RANK", "GROUP_WORLD_SIZE"} <= set(theirs)  # the comparison has teeth
        for name in ("mpilaunch", "shim"):
            ours = added(runs[name][rank]["env"], parent)
            assert set(theirs) <= set(ours), (name, sorted(set(theirs) - set(ours)))
            differ = {k: (theirs[k], ours[k]) for k in theirs if k not in THEIRS and theirs[k] != ours[k]}
            assert not differ, (name, rank, differ)
            assert runs[name][rank]["elastic"] is True
            folders = {os.path.dirname(env["TORCHELASTIC_ERROR_FILE"]) for env in (ours, theirs)}
            assert len(folders) == 2  # each launcher's own
    assert runs["torchrun"][0]["elastic"] is True
    # The MPI variables stay as they are.
    assert runs["mpilaunch"][1]["env"]["OMPI_COMM_WORLD_RANK"] == "1"
    assert runs["mpilaunch"][1]["env"]["PMI_SIZE"] == "2"


@pytest.mark.parametrize("visible", [None, "3,5"], ids=["no-list", "a-list"])
def test_virtual_local_rank_as_torchrun(launcher: Launcher, tmp_path: Path, visible: str | None) -> None:
    """--virtual-local-rank: LOCAL_RANK 0 everywhere, and each rank's own GPU alone in
    CUDA_VISIBLE_DEVICES (its local rank, or that entry of the launcher's list), as torchrun's."""
    script = write_script(tmp_path, "env_dump.py", ENV_DUMP)
    parent = {**launcher.env, "PYTHONPATH": str(ROOT)}
    parent.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        parent["CUDA_VISIBLE_DEVICES"] = visible
    seen = {}
    for name, argv in (("torchrun", [sys.executable, "-m", "torch.distributed.run"]), ("mpilaunch", launcher.argv())):
        dumped = _dumped(name, [*argv, "--virtual-local-rank", "--nproc-per-node", "2", script], parent, tmp_path)
        seen[name] = {r: (d["env"]["LOCAL_RANK"], d["env"]["CUDA_VISIBLE_DEVICES"]) for r, d in dumped.items()}
    assert seen["torchrun"] == seen["mpilaunch"]
    assert seen["mpilaunch"][1] == ("0", "5" if visible else "1")
    if visible:  # more ranks than the list's GPUs: torchrun's workers fail to start; here, one line
        proc = launcher.run("--virtual-local-rank", "--nproc-per-node", "3", script, env=parent)
        assert (proc.returncode, proc.stderr.decode()) == (
            2,
            "mpilaunch: --virtual-local-rank: local rank 2 has no GPU in CUDA_VISIBLE_DEVICES=3,5\n",
        )


def test_dry_run_shows_torchruns_variables(launcher: Launcher, tmp_path: Path) -> None:
    proc = launcher.run(
        "--dry-run", "--nproc-per-node", "2", "--master-port", "29600", "--rdzv-id", "job42", "train.py"
    )
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()
    for line in (
        "TORCHELASTIC_RUN_ID=job42",
        "ROLE_NAME=default",
        "GROUP_WORLD_SIZE=1",
        "ROLE_WORLD_SIZE=2",
        "TORCHELASTIC_RESTART_COUNT=0",
        "TORCHELASTIC_USE_AGENT_STORE=True",
        "MASTER_ADDR=127.0.0.1",
        "MASTER_PORT=29600",
    ):
        assert line in out, line
    assert f"{sys.executable} -u train.py" in out


STORE_MEET = """
import json, os
from datetime import timedelta
import torch.distributed as dist
rank, port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], port, is_master=False, timeout=timedelta(seconds=60))
store.set(f"mark{rank}", os.environ["MARK"])
print(json.dumps({"rank": rank, "world": int(os.environ["WORLD_SIZE"]), "addr": os.environ["MASTER_ADDR"],
                  "port": port, "other": store.get(f"mark{1 - rank}").decode()}), flush=True)
"""


def test_the_environments_master_port_is_not_the_jobs_and_master_port_is(launcher: Launcher, tmp_path: Path) -> None:
    """As torchrun: two jobs started at once with the same MASTER_PORT in their environment each
    get a free port of their own, and their ranks meet in their own job's store;
    --master-addr/--master-port (with --nnodes 1) are the ranks'. (A store, not gloo: two gloo
    jobs at once on two cores sometimes abort in gloo itself, under torchrun as well.)"""
    script = write_script(tmp_path, "meet.py", STORE_MEET)
    stale = {"MASTER_ADDR": "localhost", "MASTER_PORT": str(free_port())}
    jobs = [launcher.popen("--nproc-per-node", "2", script, env={**stale, "MARK": str(i)}) for i in range(2)]
    ports = set()
    for mark, job in enumerate(jobs):
        out, err = job.communicate(timeout=HANG)
        assert job.returncode == 0, err.decode()[-3000:]
        said = [json.loads(line) for line in out.decode().splitlines()]
        assert sorted(d["rank"] for d in said) == [0, 1] and {d["other"] for d in said} == {str(mark)}
        ports |= {d["port"] for d in said}
    assert len(ports) == 2 and int(stale["MASTER_PORT"]) not in ports, ports
    port = free_port()
    words = ("--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), "--nproc-per-node", "2")
    proc = launcher.run(*words, script, env={**stale, "MARK": "x"}, timeout=HANG)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    said = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert {(d["addr"], d["port"], d["other"]) for d in said} == {("127.0.0.1", port, "x")}


def test_one_nodes_launcher_names_its_ranks_by_their_job_wide_numbers(launcher: Launcher) -> None:
    """torchrun's way, node 1 of 2: the map, the dry run and a failure speak of ranks 2 and 3."""
    node = ("--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", str(free_port()))
    proc = launcher.run("--dry-run", *node, "--nproc-per-node", "2", "train.py")
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()
    assert "rank 2 on localhost:" in out and "rank 3 on localhost:" in out and "rank 0 on" not in out, out
    assert "\tRank 3\tApp: 0" in out, out


def test_a_record_error_file_names_the_rank_its_exception_and_frames_first(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(tmp_path, "record.py", RECORD)
    proc = launcher.run("--nproc-per-node", "2", "--log-dir", "logs", "--report-json", "r.json", script, timeout=HANG)
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    summary = err[err.index("-" * 74) :].splitlines()
    assert summary[1] == "rank 1 on localhost raised ValueError: bad shard 7", summary[:3]
    kept = tmp_path / "logs" / "1" / "rank.1" / "error.json"
    assert f"  Error:     ValueError: bad shard 7  (from the error file {kept})" in summary
    frames = summary.index("  Innermost frames:")
    assert summary[frames + 1].endswith(f'{script}", line 6, in load')
    assert json.loads(kept.read_text())["message"]["message"] == "ValueError: bad shard 7"  # @record's own file
    failure = json.loads((tmp_path / "r.json").read_text())["first_failure"]
    assert failure["rank"] == 1
    exception = failure["exception"]
    assert (exception["type"], exception["message"]) == ("ValueError", "bad shard 7")
    assert exception["source"] == f"the error file {kept}"
    assert "in load" in exception["frames"][0]


def test_without_an_error_file_the_traceback_on_stderr_is_the_root_cause(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(tmp_path, "plain.py", "import os\nif os.environ['RANK'] == '1':\n    {}['shard']\n")
    proc = launcher.run("--nproc-per-node", "2", script, timeout=HANG)
    summary = proc.stderr.decode().split("-" * 74)[1].splitlines()
    assert summary[1] == "rank 1 on localhost raised KeyError: 'shard'", summary[:3]
    assert "  Error:     KeyError: 'shard'  (from its stderr)" in summary


def _lines_until(proc: subprocess.Popen, count: int, word: str) -> list[str]:
    """The launcher's stdout lines until `count` of them are `word` (read from its pipe, unbuffered:
    select cannot see what a buffered reader already holds)."""
    text = b""
    deadline = time.monotonic() + HANG
    fd = proc.stdout.fileno()  # type: ignore[union-attr]
    while text.decode().splitlines().count(word) < count:
        left = deadline - time.monotonic()
        assert left > 0 and select.select([fd], [], [], left)[0], text
        chunk = os.read(fd, 65536)
        assert chunk, (text, proc.stderr.read().decode())  # type: ignore[union-attr]
        text += chunk
    return text.decode().splitlines()


def _node(launcher: Launcher, node: int, port: int, *args: str) -> subprocess.Popen:
    return launcher.popen(
        "--nnodes",
        "2",
        "--node-rank",
        str(node),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--nproc-per-node",
        "2",
        "--log-dir",
        f"node{node}",
        "--report-json",
        f"node{node}.json",
        *args,
    )


def test_two_launchers_one_per_node_form_one_world(launcher: Launcher, tmp_path: Path) -> None:
    """torchrun's way, as a Slurm script runs it: each launcher starts its node's ranks; DDP across
    the four ranks; each launcher's log tree and report hold its own node's ranks."""
    script = write_script(tmp_path, "ddp.py", DDP)
    port = free_port()
    nodes = [_node(launcher, node, port, script) for node in (0, 1)]
    outs = [p.communicate(timeout=HANG) for p in nodes]
    for proc, (_, err) in zip(nodes, outs):
        assert proc.returncode == 0, err.decode()[-3000:]
    said = [json.loads(line) for out, _ in outs for line in out.decode().splitlines()]
    assert sorted(s["rank"] for s in said) == [0, 1, 2, 3]
    assert all(s["world"] == 4 and s["gathered"] == [0.0, 1.0, 2.0, 3.0] for s in said)
    assert len({tuple(s["weights"]) for s in said}) == 1  # the gradients were averaged over the nodes
    for node in (0, 1):
        report = json.loads((tmp_path / f"node{node}.json").read_text())
        mine = [2 * node, 2 * node + 1]
        assert [r["rank"] for r in report["ranks"]] == mine  # this launcher's own, by their job-wide numbers
        logged = [json.loads((tmp_path / f"node{node}" / "1" / f"rank.{r}" / "stdout").read_text()) for r in mine]
        assert [s["rank"] for s in logged] == mine
        assert sorted(p.name for p in (tmp_path / f"node{node}" / "1").iterdir()) == [f"rank.{r}" for r in mine]


@pytest.mark.parametrize("killed", [0, 1], ids=["store-node", "other-node"])
def test_killing_one_launcher_ends_the_other_at_once(launcher: Launcher, tmp_path: Path, killed: int) -> None:
    script = write_script(tmp_path, "ddp.py", DDP)
    port = free_port()
    nodes = [_node(launcher, node, port, script, "stay") for node in (0, 1)]
    try:
        for proc in nodes:
            _lines_until(proc, 2, "ready")
        nodes[killed].kill()
        nodes[killed].wait(HANG)
        gone = time.monotonic()
        other = nodes[1 - killed]
        other.wait(HANG)
        took = time.monotonic() - gone
        err = other.stderr.read().decode()  # type: ignore[union-attr]
        assert other.returncode != 0, err
        assert took <= 1.0, f"the other node's launcher ended {took:.2f} s after: {err[-2000:]}"
        assert "this node's ranks are stopped" in err
    finally:
        for proc in nodes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]


def test_a_failure_on_one_node_is_named_by_its_job_wide_rank(launcher: Launcher, tmp_path: Path) -> None:
    port = free_port()
    failing = ("--no-python", "sh", "-c", 'test "$RANK" = 3 && exit 3; sleep 60')
    nodes = [_node(launcher, node, port, *failing) for node in (0, 1)]
    errs = [p.communicate(timeout=HANG)[1].decode() for p in nodes]
    assert nodes[1].returncode == 1, errs[1]  # torchrun's status for any failed worker
    assert "Rank:      3" in errs[1], errs[1]
    report = json.loads((tmp_path / "node1.json").read_text())
    assert [r["rank"] for r in report["ranks"] if r["exit_code"] == 3] == [3], report["ranks"]
    assert nodes[0].returncode != 0, errs[0]


def test_a_failed_attempt_is_restarted_and_the_next_succeeds(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(tmp_path, "flaky.py", FLAKY)
    proc = launcher.run(
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        "--restart-delay",
        "0",
        "--log-dir",
        "logs",
        "--report-json",
        "r.json",
        script,
        "once",
        timeout=HANG,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "mpilaunch: attempt 0 ended with status 1: the job starts again in 0 s (attempt 1 of 3)" in err
    first = (tmp_path / "logs" / "1" / "rank.1" / "stdout").read_text().split()
    second = (tmp_path / "logs" / "attempt.1" / "1" / "rank.1" / "stdout").read_text().split()
    assert first[:4] == ["attempt", "0", "rank", "1"] and second[:4] == ["attempt", "1", "rank", "1"]
    assert first[5] != second[5]  # a fresh MASTER_PORT
    report = json.loads((tmp_path / "r.json").read_text())
    assert [a["exit_status"] for a in report["attempts"]] == [1, 0]
    assert sorted((r["attempt"], r["rank"]) for r in report["ranks"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert report["exit_status"] == 0


def test_one_launcher_per_node_restarts_every_node_together(launcher: Launcher, tmp_path: Path) -> None:
    """A failure on node 1 in attempt 0: both launchers start attempt 1, which forms its world again."""
    script = write_script(tmp_path, "flaky.py", FLAKY_DDP)
    port = free_port()
    nodes = [_node(launcher, node, port, "--max-restarts", "1", "--restart-delay", "0", script) for node in (0, 1)]
    outs = [p.communicate(timeout=HANG) for p in nodes]
    for proc, (_, err) in zip(nodes, outs):
        assert proc.returncode == 0, err.decode()[-3000:]
        assert "attempt 0 ended with status" in err.decode()
    said = sorted(line for out, _ in outs for line in out.decode().splitlines())
    assert said == sorted(f"attempt {a} rank {r} of 4" for a in (0, 1) for r in range(4))


def _c10d(launcher: Launcher, port: int, *args: str, env: dict | None = None) -> subprocess.Popen:
    """A launcher as PyTorch's docs start one per node: c10d, no --node-rank."""
    words = ("--rdzv-id", "100", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}")
    return launcher.popen(*words, *args, env=env)


def test_c10d_launchers_without_node_ranks_are_numbered_as_torchrun_numbers_them(
    launcher: Launcher, tmp_path: Path
) -> None:
    """--nnodes 1:2 and no --node-rank: the meeting closes once both launchers are there (MAX),
    numbers the nodes by host, then pid (torch's order), and meets again for the restart."""
    script = write_script(tmp_path, "flaky.py", FLAKY_DDP)
    port = free_port()
    words = ("--nnodes", "1:2", "--nproc-per-node", "2", "--max-restarts", "1", "--restart-delay", "0", script)
    nodes = [_c10d(launcher, port, *words) for _ in range(2)]
    outs = [p.communicate(timeout=HANG) for p in nodes]
    for proc, (_, err) in zip(nodes, outs):
        assert proc.returncode == 0, err.decode()[-3000:]
        assert "attempt 0 ended with status" in err.decode()
    first = min(range(2), key=lambda k: nodes[k].pid)  # one host: the lower pid is node 0
    said = {k: sorted(outs[k][0].decode().splitlines()) for k in range(2)}
    assert said[first] == sorted(f"attempt {a} rank {r} of 4" for a in (0, 1) for r in (0, 1))
    assert said[1 - first] == sorted(f"attempt {a} rank {r} of 4" for a in (0, 1) for r in (2, 3))


def test_min_max_nodes_alone_runs_after_the_last_call(launcher: Launcher, tmp_path: Path) -> None:
    """One launcher of --nnodes 1:2 waits c10d's last call (--rdzv-conf last_call_timeout) for
    another, then runs the nodes there are; with nowhere to meet it runs at once. (The ranks meet
    in their store, not in gloo, which now and then aborts on its own: see STORE_MEET's test.)"""
    script = write_script(tmp_path, "meet.py", STORE_MEET)
    started = time.monotonic()
    words = ("--nnodes", "1:2", "--rdzv-conf", "last_call_timeout=2", "--nproc-per-node", "2", script)
    proc = _c10d(launcher, free_port(), *words, env={"MARK": "m"})
    out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 0 and time.monotonic() - started >= 2.0, err.decode()[-3000:]
    assert sorted((s["rank"], s["world"]) for s in map(json.loads, out.decode().splitlines())) == [(0, 2), (1, 2)]
    proc = launcher.run("--nnodes", "1:2", "--nproc-per-node", "2", script, timeout=HANG, env={"MARK": "m"})
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert sorted(json.loads(line)["world"] for line in proc.stdout.decode().splitlines()) == [2, 2]


def test_a_job_that_always_fails_ends_with_its_status_after_every_attempt(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(tmp_path, "flaky.py", FLAKY)
    proc = launcher.run(
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "2",
        "--restart-delay",
        "0",
        "--report-json",
        "r.json",
        script,
        "always",
        timeout=HANG,
    )
    assert proc.returncode == 1, proc.stderr.decode()  # torchrun's, whatever the worker's code
    assert "Exit code: 3" in proc.stderr.decode() or "exit code 3" in proc.stderr.decode()
    assert [line.split()[1] for line in proc.stdout.decode().splitlines()] == ["0", "1", "2"]
    assert len(json.loads((tmp_path / "r.json").read_text())["attempts"]) == 3


def test_ctrl_c_is_never_restarted(launcher: Launcher, tmp_path: Path) -> None:
    script = write_script(tmp_path, "wait.py", "import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    proc = launcher.popen(
        "--nproc-per-node", "2", "--max-restarts", "2", "--restart-delay", "0", script, preexec_fn=_default_sigint
    )
    err, _ = _signalled_when_ready(proc, 2, signal.SIGINT, tmp_path)
    assert proc.returncode == 1, err.decode()  # torchrun's, when a signal stopped it
    assert "starts again" not in err.decode()


CALM = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
with open(f"pid.{os.getpid()}", "w"):
    pass
os.write(1, b"ready\\n")  # one write: two ranks' lines never run together
time.sleep(600)
"""


def _signalled_when_ready(
    proc: subprocess.Popen, ready: int, sig: int, folder: Path, timeout: float = HANG
) -> tuple[bytes, float]:
    """Send the launcher sig once `ready` ranks said so; (its stderr, seconds from the signal to
    its end). A launcher that does not end is killed, and so are the ranks that recorded their
    pid in folder (a launcher killed with SIGKILL leaves them behind)."""
    try:
        _lines_until(proc, ready, "ready")
        proc.send_signal(sig)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=timeout)
        return err, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
            for mark in folder.glob("pid.*"):
                try:
                    os.kill(int(mark.suffix[1:]), signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.mark.parametrize("who", ["torchrun", "mpilaunch"])
def test_a_launcher_stopped_by_sigterm_exits_1_though_its_ranks_exit_0(
    launcher: Launcher, tmp_path: Path, who: str
) -> None:
    script = write_script(tmp_path, "calm.py", CALM)
    argv = [sys.executable, "-m", "torch.distributed.run"] if who == "torchrun" else launcher.argv()
    proc = subprocess.Popen(
        [*argv, "--nproc-per-node", "2", script],
        env=launcher.env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    err, _ = _signalled_when_ready(proc, 2, signal.SIGTERM, tmp_path)
    assert proc.returncode == 1, err.decode()[-2000:]


def test_shutdown_timeout_is_the_grace_a_stopped_launcher_gives_its_ranks(launcher: Launcher, tmp_path: Path) -> None:
    """torchrun's --shutdown-timeout: a rank that ignores the launcher's SIGTERM is killed S seconds later."""
    script = write_script(tmp_path, "deaf.py", CALM.replace("lambda *_: sys.exit(0)", "signal.SIG_IGN"))
    proc = launcher.popen("--nproc-per-node", "1", "--shutdown-timeout", "1", script)
    err, took = _signalled_when_ready(proc, 1, signal.SIGTERM, tmp_path, timeout=30)
    assert proc.returncode == 1 and 1.0 <= took < 10.0, (took, err.decode()[-2000:])


@pytest.mark.parametrize(
    ("words", "status"), [((), 130), (("--nproc-per-node", "1", "--no-python"), 1)], ids=["mpirun's", "torchrun's"]
)
def test_ctrl_c_during_the_restart_delay_ends_the_run_at_once(
    launcher: Launcher, tmp_path: Path, words: tuple[str, ...], status: int
) -> None:
    """With the status of the command line's launcher: the shell's 130, torchrun's 1."""
    proc = launcher.popen(
        *words, "--max-restarts", "3", "--restart-delay", "600", "sh", "-c", "exit 3", preexec_fn=_default_sigint
    )
    try:
        fd = proc.stderr.fileno()  # type: ignore[union-attr]
        said = b""
        while b"starts again in 600 s" not in said:
            assert select.select([fd], [], [], HANG)[0], said
            chunk = os.read(fd, 65536)
            assert chunk, said
            said += chunk
        proc.send_signal(signal.SIGINT)
        proc.wait(HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    assert proc.returncode == status


def test_a_plain_job_and_torchrun_spellings(launcher: Launcher, tmp_path: Path) -> None:
    """-m runs a module, --no-python the program itself, --run-path a file through runpy; the
    script's own options pass through untouched, and a `--` right after it is dropped, as torchrun."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "hello.py").write_text("import os, sys\nprint(__name__, os.environ['RANK'], sys.argv[1:])\n")
    proc = launcher.run("--nproc-per-node", "1", "-m", "pkg.hello", "--", "--lr", "0.1", "-n", "3", "--")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().split("\n")[0] == "__main__ 0 ['--lr', '0.1', '-n', '3', '--']"
    proc = launcher.run("--nproc-per-node", "2", "--no-python", "sh", "-c", 'echo "sh $RANK"')
    assert sorted(proc.stdout.decode().split("\n")[:2]) == ["sh 0", "sh 1"], proc.stderr.decode()
    proc = launcher.run("--nproc-per-node", "1", "--run-path", str(tmp_path / "pkg" / "hello.py"), "x")
    assert proc.stdout.decode().split("\n")[0] == "__main__ 0 ['x']", proc.stderr.decode()


def test_redirects_tee_and_the_local_ranks_filter(launcher: Launcher, tmp_path: Path) -> None:
    """-r sends streams to files only, -t to files and the console (each line labelled
    `[<role><local rank>]:`, as torchrun's), --local-ranks-filter keeps the other ranks off the
    console; every byte still reaches the log tree, unlabelled."""
    script = write_script(
        tmp_path,
        "say.py",
        "import os, sys\nr = os.environ['LOCAL_RANK']\nprint('out', r)\nprint('err', r, file=sys.stderr)\n",
    )
    proc = launcher.run("-q", "--nproc-per-node", "2", "--local-ranks-filter", "1", "--log-dir", "a", script)
    assert (proc.stdout.decode(), proc.stderr.decode()) == ("out 1\n", "err 1\n")
    assert (tmp_path / "a" / "1" / "rank.0" / "stderr").read_text() == "err 0\n"
    proc = launcher.run("-q", "--nproc-per-node", "2", "-r", "3", "-t", "0:1", "--log-dir", "b", script)
    assert (proc.stdout.decode(), proc.stderr.decode()) == ("[default0]:out 0\n", "")  # torchrun's label, tee'd
    assert (tmp_path / "b" / "1" / "rank.1" / "stdout").read_text() == "out 1\n"
    proc = launcher.run("-q", "--nproc-per-node", "2", "-t", "0:1", "-r", "1:2", "--role", "trainer", script)
    assert sorted(proc.stdout.decode().splitlines()) == ["[trainer0]:out 0", "out 1"]  # only tee'd lines labelled
    assert proc.stderr.decode() == "err 0\n"
    proc = launcher.run("--nproc-per-node", "1", "-r", "1", script)  # no --log-dir: a temp dir, said
    said = [line for line in proc.stderr.decode().splitlines() if "rank output goes to" in line]
    assert proc.stdout == b"" and len(said) == 1, proc.stderr.decode()
    folder = said[0].split("goes to ")[1][: -len("/rank.N")]
    try:
        assert Path(folder, "rank.0", "stdout").read_text() == "out 0\n"
    finally:
        subprocess.run(["rm", "-rf", os.path.dirname(folder)], check=True)


@pytest.mark.parametrize(
    "words, says",
    [
        (["--nnodes", "1:4", "--master-addr", "h"], "--nnodes 1:4 with torchrun's static rendezvous: give"),
        (["--nnodes", "3:2"], "--nnodes '3:2': expected N or MIN:MAX (MIN <= MAX)"),
        (["--rdzv-conf", "last_call_timeout"], "--rdzv-conf 'last_call_timeout': expected KEY=VALUE,..."),
        (["--rdzv-backend", "etcd"], "--rdzv-backend etcd: mpilaunch's launchers meet through a store"),
        (["--nproc-per-node", "many"], "--nproc-per-node 'many': expected a number from 1, auto, cpu or gpu"),
        (["--nnodes", "2", "--master-addr", "127.0.0.1"], "--nnodes 2 with torchrun's static rendezvous: give"),
        (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h"], "--node-rank 2: expected 0 to 1 for --nnodes 2"),
        (["--nnodes", "2", "--node-rank", "0", "--master-addr", "h", "--mpi", "pmix"], "--mpi pmix with torchrun's"),
        (["-r", "7"], "--redirects '7': expected 0 to 3"),
        (["--local-ranks-filter", "a"], "--local-ranks-filter 'a': expected local ranks"),
    ],
)
def test_what_cannot_be_honoured_is_refused_in_one_line(
    launcher: Launcher, tmp_path: Path, words: list[str], says: str
) -> None:
    proc = (
        launcher.run(*words, "--nproc-per-node", "1", "train.py")
        if "--nproc-per-node" not in words
        else (launcher.run(*words, "train.py"))
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.startswith(f"mpilaunch: {says}") and err.count("\n") == 1, err
