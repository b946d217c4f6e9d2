"""--report-json against what the ranks really did: each rank records its pid, when it ran, the
CPU it used and the memory it held (tests/ranks/accounted.py), and every field of the report
is checked against that, for a success, a failure that aborts, a failure with abort off, the
timeout, Ctrl-C, and a run refused before it started."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from tests.conftest import ROOT, Launcher

PY = sys.executable
RANK = str(ROOT / "tests" / "ranks" / "accounted.py")
CPU = 0.3  # seconds each rank spends
MIB = 40  # what each rank holds
SLACK = 0.05  # seconds: the launcher's clock and the ranks' are the same clock, read at other moments
REPORTED = 0.5  # seconds: a rank's start reaches the launcher within this of its first line


def accounted(launcher: Launcher, tmp_path: Path, actions: list[str], *options: str, sig: int | None = None):
    """Run the ranks; with sig, send it to the launcher once every rank has written its record."""
    records = tmp_path / "records"
    records.mkdir()
    report = tmp_path / "run.json"
    args = [*options, "--report-json", str(report), "-n", str(len(actions))]
    args += [PY, RANK, str(records), str(CPU), str(MIB), ",".join(actions)]
    if sig is None:
        proc = launcher.run(*args, timeout=60)
        status, err = proc.returncode, proc.stderr.decode()
    else:
        running = launcher.popen(*args)
        deadline = time.monotonic() + 30
        while len(list(records.glob("*.json"))) < len(actions):
            assert time.monotonic() < deadline and running.poll() is None, "the ranks never came up"
            time.sleep(0.02)
        running.send_signal(sig)
        _, raw_err = running.communicate(timeout=30)
        status, err = running.returncode, raw_err.decode()
    document = json.loads(report.read_text())
    ranks = {int(p.stem): json.loads(p.read_text()) for p in records.glob("*.json")}
    return status, document, ranks, err


def check_ranks(document: dict, ranks: dict, hosts: list[str]) -> None:
    """What each rank entry says about its rank, against the rank's own record."""
    assert [(entry["job"], entry["rank"], entry["app"]) for entry in document["ranks"]] == [
        (1, r, 0) for r in range(len(hosts))
    ]
    for entry, host in zip(document["ranks"], hosts):
        record = ranks[entry["rank"]]
        assert entry["host"] == host
        assert entry["pid"] == record["pid"]
        # reported as it started, not later: the report crosses the launcher's loop (and over SSH a
        # link), so on a loaded machine it may arrive after the rank's first line of Python
        assert entry["started"] <= record["t0"] + REPORTED
        assert entry["ended"] >= record["t1"] - SLACK
        assert document["started"] - SLACK <= entry["started"] <= entry["ended"] <= document["ended"] + SLACK
        assert entry["cpu_seconds"] >= record["cpu"] * 0.95  # its whole life, from its agent's wait4
        assert entry["cpu_seconds"] < record["cpu"] + 5
        assert entry["peak_rss_bytes"] >= MIB << 20
        assert entry["peak_rss_bytes"] < (MIB + 200) << 20


def test_a_successful_run(launcher: Launcher, tmp_path: Path) -> None:
    status, document, ranks, _ = accounted(launcher, tmp_path, ["0", "0"])
    assert status == 0 == document["exit_status"]
    assert document["outcome"] == "success" and document["first_failure"] is None
    assert not document["aborted"] and document["stop_signal"] is None
    assert document["command"][0] == "mpilaunch" and document["command"][-1] == "0,0"
    assert document["hosts"] == [{"name": "localhost", "slots": 2, "ranks": 2}]
    assert document["seconds"] > CPU
    check_ranks(document, ranks, ["localhost"] * 2)
    for entry in document["ranks"]:
        assert (entry["state"], entry["exit_code"], entry["signal"], entry["killed"]) == ("exited", 0, None, False)


def test_a_failure_that_aborts_the_job(launcher: Launcher, tmp_path: Path) -> None:
    status, document, ranks, err = accounted(launcher, tmp_path, ["3", "sleep"], "--kill-timeout", "1")
    assert status == 3 == document["exit_status"], err
    assert document["outcome"] == "failed" and document["aborted"]
    check_ranks(document, ranks, ["localhost"] * 2)
    failed, killed = document["ranks"]
    assert (failed["state"], failed["exit_code"], failed["signal"], failed["killed"]) == ("failed", 3, None, False)
    assert (killed["exit_code"], killed["signal"], killed["killed"]) == (None, "SIGTERM", True)
    first = document["first_failure"]
    assert first["rank"] == 0 and first["pid"] == ranks[0]["pid"] and first["exit_code"] == 3
    assert first["last_stderr"] == ["rank 0 3"] and first["command"] == [PY, RANK, *first["command"][2:]]
    assert first["abort_code"] is None


def test_a_failure_with_abort_off(launcher: Launcher, tmp_path: Path) -> None:
    status, document, ranks, _ = accounted(launcher, tmp_path, ["3", "0"], "-mca", "orte_abort_on_non_zero_status", "0")
    assert status == 3 == document["exit_status"]
    assert document["outcome"] == "failed" and not document["aborted"]
    check_ranks(document, ranks, ["localhost"] * 2)
    assert [(e["exit_code"], e["killed"]) for e in document["ranks"]] == [(3, False), (0, False)]


def test_the_timeout(launcher: Launcher, tmp_path: Path) -> None:
    status, document, ranks, _ = accounted(launcher, tmp_path, ["sleep", "sleep"], "--timeout", "4")
    assert status == 124 == document["exit_status"]
    assert document["outcome"] == "timeout" and document["aborted"] and document["first_failure"] is None
    check_ranks(document, ranks, ["localhost"] * 2)
    for entry in document["ranks"]:
        assert (entry["signal"], entry["killed"]) == ("SIGTERM", True)
    assert document["seconds"] >= 4


def test_ctrl_c(launcher: Launcher, tmp_path: Path) -> None:
    status, document, ranks, err = accounted(launcher, tmp_path, ["wait", "wait"], sig=signal.SIGINT)
    assert status == 130 == document["exit_status"], err
    assert document["outcome"] == "interrupted" and document["stop_signal"] == "SIGINT"
    assert document["first_failure"] is None and not document["aborted"]
    check_ranks(document, ranks, ["localhost"] * 2)
    for entry in document["ranks"]:  # each ended on its own, of the SIGINT forwarded to it
        assert (entry["signal"], entry["killed"]) == ("SIGINT", False)


def test_a_run_refused_before_it_started(launcher: Launcher, tmp_path: Path) -> None:
    proc = launcher.run("--report-json", "run.json", "-n", "2", "no-such-program")
    document = json.loads((tmp_path / "run.json").read_text())
    assert proc.returncode == 2 == document["exit_status"]
    assert document["outcome"] == "refused" and document["ranks"] == []
    assert document["error"] == "program 'no-such-program' not found (PATH and working directory " + f"{tmp_path})"
    assert proc.stderr.decode().strip() == f"mpilaunch: {document['error']}"


def test_an_unwritable_report_is_said_and_the_status_stays_the_runs(launcher: Launcher, tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file, not a directory")
    proc = launcher.run("--report-json", "taken/run.json", "-n", "1", PY, "-c", "raise SystemExit(5)")
    assert proc.returncode == 5
    assert "mpilaunch: --report-json: cannot write" in proc.stderr.decode()
