"""The README's promises about set-up stay true."""

from __future__ import annotations

import re

from tests.conftest import ROOT


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def test_readme_has_two_setup_commands_and_ci_runs_the_second() -> None:
    commands = readme_commands()
    assert len(commands) == 2
    assert commands[0].startswith("pip install .") and "mpilaunch" in commands[0]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci


def test_the_package_has_its_console_script_and_extras() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'mpilaunch = "mpilaunch.__main__:main"' in text
    runtime = text.split("[project.optional-dependencies]")[0]
    for dep in ("click", "pyyaml", "paramiko"):
        assert dep in runtime
    # The agent reads /proc itself (stdlib only, it runs on hosts with only Python) and the
    # launcher inspects no process: psutil (11 ms to import) is only the tests' way to look.
    assert "psutil" not in runtime
    test_extra = text.split("test = [", 1)[1].split("]", 1)[0]
    for dep in ("pytest", "pytest-xdist", "hypothesis", "psutil", "mpi4py", "mpich", "numpy"):
        assert dep in test_extra
    assert 'report = ["matplotlib' in text  # `mpilaunch report -o report.png`
    assert 'debug = ["py-spy' in text and '"py-spy' in test_extra  # Python ranks' stacks (tests/local/test_stacks.py)
    assert '"torch==2.13.0"' in test_extra  # the PyTorch DDP tests (tests/mpi/test_clients.py); a CPU build is enough
