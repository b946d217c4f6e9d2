"""Job files and host sources, run for real: what was parsed is what runs."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import Launcher


def test_a_local_allocation_runs_for_real(launcher: Launcher, tmp_path: Path) -> None:
    """This machine's names in an allocation are merged into one node and run without SSH."""
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("localhost\nlocalhost\n127.0.0.1\n")
    proc = launcher.run(
        "--display-map", sys.executable, "-c", "import os; print('rank', os.environ['RANK'])",
        env={"PBS_NODEFILE": str(nodefile)},
    )  # fmt: skip
    stdout = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr
    assert b"Traceback" not in proc.stderr
    sources = [line.strip() for line in stdout.splitlines() if "hosts from" in line]
    assert sources[0] == f"hosts from: PBS_NODEFILE {nodefile}; 3 slots"
    assert sorted(line for line in stdout.splitlines() if line.startswith("rank")) == ["rank 0", "rank 1", "rank 2"]


def test_job_file_runs_for_real(launcher: Launcher, tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(
        "np: 2\noversubscribe: true\ntag_output: true\nenv:\n  GREETING: hello from the file\n"
        "command: [" + sys.executable + ", -c, \"import os; print(os.environ['GREETING'], os.environ['RANK'])\"]\n"
    )
    proc = launcher.run("--config", "job.yaml")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.decode().splitlines()) == [
        "[1,0]<stdout>:hello from the file 0",
        "[1,1]<stdout>:hello from the file 1",
    ]
    proc = launcher.run("--config", "job.yaml", "-n", "1", "-x", "GREETING=hi", "--tag-output", "echo", "replaced")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == "[1,0]<stdout>:replaced\n"


def test_bad_job_file_one_line_status_2(launcher: Launcher, tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("np: 8\noversubscribe: true\n\n\n\n# ranks\nnp_: eight\n")
    proc = launcher.run("--config", "job.yaml", "true")
    assert proc.returncode == 2
    assert proc.stderr.decode() == "mpilaunch: job.yaml:7: unknown key 'np_' (did you mean 'np'?)\n"
    (tmp_path / "job.yaml").write_text("np: 8\noversubscribe: true\n\n\n\n# ranks\nnp: eight\n")
    proc = launcher.run("--config", "job.yaml", "true")
    assert proc.returncode == 2
    assert proc.stderr.decode() == "mpilaunch: job.yaml:7: key 'np' given twice (first on line 1)\n"
