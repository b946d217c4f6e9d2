"""The product as its users run it, for the benches: a venv with a plain `pip install` of this
checkout (or of an older commit), made once per commit and kept under `.cache/bench-venvs/`.

A plain venv, as a user makes one: `pip install '.[bench]'` (mpi4py over the `mpich` wheel, with
psutil and py-spy) of a copy of the commit (`git archive`), never of the working tree, so a bench
times what `pip install .` gives, its bytecode compiled by pip, without the base interpreter's
site hooks or an editable install's finder. A bench whose ranks import torch (bench.restart
--torch) asks for system_site: a venv of its own with `--system-site-packages`, where the
system's torch is found but this venv's mpilaunch comes first on the path.

    python -m bench.installed [COMMIT]     # make (or find) the venv; print its mpilaunch
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import venv
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEPT = ROOT / ".cache" / "bench-venvs"


def commit_of(name: str = "HEAD") -> str:
    """The full hash of a commit of this checkout."""
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{name}^{{commit}}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def installed(name: str = "HEAD", system_site: bool = False) -> Path:
    """The bin folder of a venv where that commit of mpilaunch is installed (made if missing):
    its `mpilaunch` and its `python` are what a bench runs."""
    commit = commit_of(name)
    home = KEPT / (commit[:12] + ("-system-site" if system_site else ""))
    bin_dir = home / "bin"
    if (bin_dir / "mpilaunch").exists():
        return bin_dir
    with tempfile.TemporaryDirectory(prefix="bench-src-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        venv.EnvBuilder(with_pip=True, clear=True, system_site_packages=system_site).create(home)
        pip = [str(bin_dir / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, f"{tmp}[bench]", "psutil", "py-spy"], check=True)
    return bin_dir


def clean_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment without PYTHONPATH: what the venv's mpilaunch imports is what pip installed."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k != "PYTHONPATH"}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(installed(args[0] if args else "HEAD") / "mpilaunch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
