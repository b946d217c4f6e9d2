"""torchrun's words that run something (cli/torchrun_words.py): `--nproc-per-node gpu` runs
nvidia-smi (here a script in its place), and --run-path's program runs the script as __main__.
The rest of torchrun's words: tests/unit/test_torchrun_words.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import fake_smi
from tests.unit.test_torchrun_words import _no_pet, refused, spec  # noqa: F401  (_no_pet: an autouse fixture)


def test_nproc_per_node_gpu_counts_what_nvidia_smi_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listing = "GPU 0: A100 (UUID: GPU-a)\\nGPU 1: A100 (UUID: GPU-b)\\n  MIG 1g.5gb Device 0: (UUID: MIG-c)\\n"
    listing += "GPU 2: A100 (UUID: GPU-d)\\n"
    smi = fake_smi(tmp_path, f'[ "$1" = -L ] && printf "{listing}"')
    monkeypatch.setenv("PATH", f"{smi}:{os.environ['PATH']}")
    job = spec("--nproc-per-node", "gpu", "t.py")
    assert job.options.torch is not None and job.options.torch.nproc_per_node == 3  # the MIG line is no GPU
    assert job.options.npernode == 3


def test_nproc_per_node_gpu_without_a_gpu_is_refused_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = fake_smi(tmp_path, "echo 'NVIDIA-SMI has failed because it could not communicate' >&2; exit 9")
    monkeypatch.setenv("PATH", broken)
    said = refused("--nproc-per-node", "gpu", "t.py")
    assert said.startswith("--nproc-per-node gpu: no GPU found") and "NVIDIA-SMI has failed" in said
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\ntrue\n")  # lists none
    assert refused("--nproc-per-node", "gpu", "t.py").endswith("(nvidia-smi counts none)")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert refused("--nproc-per-node", "gpu", "t.py").endswith("(no nvidia-smi on PATH)")


def test_run_path_runs_the_script_as_main_with_its_arguments(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint(__name__, sys.argv)\n")
    argv = spec("--run-path", "--standalone", str(script), "a", "--b").apps[0].argv
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    assert out == f"__main__ {[str(script), 'a', '--b']}\n"
