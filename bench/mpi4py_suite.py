"""mpi4py's own test suite under mpilaunch and under each MPI library's own mpiexec, module by module.

Run by hand (slow, not part of the tests):
    python -m bench.mpi4py_suite [--np 2] [--mpi mpich|impi|both] [--modules test_comm,test_rma] [--timeout 300]
For each test module of mpi4py's suite (test/test_*.py of the mpi4py sdist of the version the ranks'
interpreter has; downloaded once with pip and kept in ~/.cache/mpilaunch-tests/mpi4py-tests/VERSION),
one job runs `python test/main.py --no-builddir -q test_x` (as mpi4py's tox.ini does) on --np ranks,
under the library's mpiexec (hydra: MPICH's from the `mpich` wheel, Intel's from the impi-rt venv that
tests/mpi/test_impi.py builds) and under mpilaunch as `pip install` gives it (bench/installed.py: a
venv of this checkout's HEAD with mpi4py over the `mpich` wheel, whose Python and hydra are MPICH's
ranks' and mpiexec), given nothing beyond
--allow-run-as-root --oversubscribe; the two launchers alternate, module by module. Both get the same
interpreter, working directory (a fresh temporary one per job) and environment, without the caller's
I_MPI_/PMI_/MPI4PY_/HYDRA_/MPIEXEC_ variables and PYTHONPATH. A job passes when it exits 0 (main.py exits 1 on a rank
where a test fails) and no rank printed unittest's "FAILED"; a job that runs past --timeout is killed
(its process group, then any process left with its tag) and counts as a timeout. Per MPI, a table:
each launcher's result (ran N tests, f=failures, e=errors, s=skipped, as the ranks reported them; a
`*` where the two launchers' summaries differ), wall times and their ratio, then whether the same
modules pass. Every job's raw output is kept in --out (a new /tmp folder by default).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import TAG, tagged

ROOT = Path(__file__).resolve().parent.parent
# What the caller's shell may carry that would tune one launcher's ranks and not the other's.
DROPPED = ("I_MPI_", "PMI_", "MPI4PY_", "HYDRA_", "MPIEXEC_", "PYTHONPATH")
# unittest's summary, per rank: "Ran N tests in Xs", then "OK" or "FAILED", then " (failures=1, skipped=2)"
# or nothing, in three writes. Hydra forwards chunks, not lines, so another rank's bytes may sit anywhere
# between or around them ("OKRan 52 tests", "OKOK", "OK---- (skipped=8)"): each part is found on its own,
# unanchored (but not inside a word), once the lines indented by 4 spaces are dropped (tracebacks, and
# the copy of a rank's last lines in mpilaunch's failure report). Only the table's counts come from
# these; pass/fail is the exit status.
INDENTED = re.compile(r"(?m)^    .*\n?")
RAN = re.compile(r"Ran (\d+) tests? in [0-9.]+s")
RESULT = re.compile(r"(?:(?<![a-z_])|(?<=[0-9]s))(OK|FAILED)(?![a-z_])")
COUNTS = re.compile(r" \(((?:(?:failures|errors|skipped|expected failures|unexpected successes)=\d+(?:, )?)+)\)")
SHORT = {"failures": "f", "errors": "e", "skipped": "s", "expected failures": "xf", "unexpected successes": "us"}


@dataclass
class Job:
    """One module under one launcher."""

    argv: list[str]
    returncode: int | None = None  # None: timed out
    seconds: float = 0.0
    output: str = ""
    ran: list[int] = field(default_factory=list)  # per rank that printed a summary
    results: list[str] = field(default_factory=list)  # "OK" or "FAILED", per rank that printed one
    counts: list[str] = field(default_factory=list)  # "f=1 s=2", per rank that printed some
    left: int = 0  # processes of the job still there after the launcher exited

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and not any(r.startswith("FAILED") for r in self.results)

    def cell(self, size: int) -> str:
        if self.returncode is None:
            head = "TIMEOUT"
        elif self.passed:
            head = "pass"
        else:
            head = "FAIL" if self.returncode == 0 else f"FAIL rc={self.returncode}"
        ran = sorted(set(self.ran))
        parts = [head]
        if ran:
            parts.append("ran " + "/".join(map(str, ran)))
        counts = sorted(set(self.counts))
        if counts:
            parts.append(" | ".join(counts))
        if len(self.results) != size:
            parts.append(f"{len(self.results)}/{size} summaries")
        if self.left:
            parts.append(f"{self.left} left behind")
        return " ".join(parts)

    def summary(self) -> tuple:
        """What must be equal for two launchers to count as giving the same result."""
        return self.passed, sorted(self.ran), sorted(self.results), sorted(self.counts)


def parse(job: Job, text: str) -> None:
    job.output = text
    text = INDENTED.sub("", text)
    job.ran = [int(m.group(1)) for m in RAN.finditer(text)]
    job.results = RESULT.findall(text)
    for found in COUNTS.findall(text):
        items = (item.partition("=") for item in found.split(", "))
        job.counts.append(" ".join(f"{SHORT.get(key, key)}={value}" for key, _, value in items))


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED)}
    env.setdefault("OMP_NUM_THREADS", "1")  # mpilaunch would say it sets this; hydra leaves it
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing written into the cached suite
    return env


def run_job(argv: list[str], timeout: float) -> Job:
    """Run one job in its own session and temporary folder; on timeout, SIGTERM then SIGKILL its group."""
    job = Job(argv)
    tag = f"{os.getpid()}_{time.time_ns()}"
    env = {**clean_env(), TAG: tag}
    with tempfile.TemporaryDirectory(prefix="mpi4py-suite-") as work:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=timeout)
            job.returncode = proc.returncode
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    out, _ = proc.communicate(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                proc.kill()
                out, _ = proc.communicate()
        job.seconds = time.perf_counter() - start
        deadline = time.monotonic() + 5.0
        while (left := tagged(tag)) and time.monotonic() < deadline:
            time.sleep(0.05)
        job.left = len(left)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    parse(job, out.decode(errors="replace"))
    return job


@dataclass
class Mpi:
    name: str
    python: str
    mpiexec: str


def mpich() -> Mpi:
    """The installed mpilaunch's venv: its Python has mpi4py over the `mpich` wheel, hydra beside it."""
    from bench.installed import installed

    venv = installed()
    hydra = venv / "mpiexec.hydra"
    if not hydra.exists():
        raise SystemExit(f"no {hydra}: the bench extra brings the mpich wheel")
    return Mpi("mpich", str(venv / "python"), str(hydra))


def impi(venv: str | None) -> Mpi:
    """The Intel MPI venv: --impi-venv, else the tests' cached one (built now if it is not there)."""
    if venv:
        prefix = Path(venv)
    else:
        sys.path.insert(0, str(ROOT))
        from tests.mpi.test_impi import IMPI_PACKAGES
        from tests.venvs import cached_venv

        python, why = cached_venv("impi", IMPI_PACKAGES)
        if python is None:
            raise SystemExit(why)
        prefix = python.parent.parent
    return Mpi("impi", str(prefix / "bin" / "python"), str(prefix / "bin" / "mpiexec"))


def cache_root() -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.venvs import CACHE

    return CACHE / "mpi4py-tests"


def suite(python: str) -> Path:
    """mpi4py's test/ folder for the mpi4py version of `python`, from its sdist (pip download, once)."""
    version = subprocess.run([python, "-c", "import mpi4py; print(mpi4py.__version__)"], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
    folder = cache_root() / version
    if (folder / "main.py").exists():
        return folder
    with tempfile.TemporaryDirectory(prefix="mpi4py-sdist-") as tmp:
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps"]
        proc = subprocess.run([*pip, f"mpi4py=={version}", "-d", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"cannot download the mpi4py {version} sdist: {proc.stderr.strip()[-300:]}")
        (sdist,) = Path(tmp).glob("mpi4py-*.tar.gz")
        partial = folder.with_name(f"{version}.partial")
        partial.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if len(parts) == 3 and parts[1] == "test" and member.isfile():
                    (partial / parts[2]).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
        partial.rename(folder)
    return folder


def launchers(mpi: Mpi) -> dict[str, Callable[[int], list[str]]]:
    """Each launcher's argv prefix for n ranks; mpilaunch the installed one (bench/installed.py)."""
    from bench.installed import installed

    ours = str(installed() / "mpilaunch")
    return {
        "mpiexec": lambda n: [mpi.mpiexec, "-n", str(n)],
        "mpilaunch": lambda n: [ours, "--allow-run-as-root", "--oversubscribe", "-n", str(n)],
    }


def compare(mpi: Mpi, size: int, modules: list[str] | None, timeout: float, out: Path) -> tuple[bool, dict[str, float]]:
    tests = suite(mpi.python)
    found = sorted(p.stem for p in tests.glob("test_*.py"))
    if modules:
        missing = sorted(set(modules) - set(found))
        if missing:
            raise SystemExit(f"not in the suite ({tests}): {', '.join(missing)}")
        found = [m for m in found if m in modules]
    peers = launchers(mpi)
    print(f"\n## {mpi.name}: {len(found)} modules of {tests}, {size} ranks, {mpi.python}", flush=True)
    print("| module | mpiexec | mpilaunch | mpiexec s | mpilaunch s | ratio |\n|---|---|---|---|---|---|", flush=True)
    totals = dict.fromkeys(peers, 0.0)
    differ: list[str] = []
    for index, module in enumerate(found):
        order = list(peers) if index % 2 == 0 else list(reversed(peers))  # alternate who runs first
        jobs: dict[str, Job] = {}
        for name in order:
            argv = [*peers[name](size), mpi.python, str(tests / "main.py"), "--no-builddir", "-q", module]
            jobs[name] = run_job(argv, timeout)
            totals[name] += jobs[name].seconds
            log = out / mpi.name / f"np{size}" / f"{module}.{name}.txt"
            log.parent.mkdir(parents=True, exist_ok=True)
            status = "timeout" if jobs[name].returncode is None else jobs[name].returncode
            log.write_text(f"$ {' '.join(argv)}\n# exit {status}, {jobs[name].seconds:.2f} s\n{jobs[name].output}")
        ref, ours = jobs["mpiexec"], jobs["mpilaunch"]
        if ref.passed != ours.passed:
            differ.append(module)
        note = "" if ref.summary() == ours.summary() else " *"
        ratio = ours.seconds / ref.seconds if ref.seconds else float("nan")
        cells = [module + note, ref.cell(size), ours.cell(size), f"{ref.seconds:.2f}", f"{ours.seconds:.2f}"]
        print("| " + " | ".join([*cells, f"{ratio:.2f}x"]) + " |", flush=True)
    ratio = totals["mpilaunch"] / totals["mpiexec"] if totals["mpiexec"] else float("nan")
    print(f"| total | | | {totals['mpiexec']:.1f} | {totals['mpilaunch']:.1f} | {ratio:.2f}x |")
    print("(* the two launchers' unittest summaries differ: counts, or the number of ranks reporting)")
    same = "yes" if not differ else "no: " + ", ".join(differ)
    print(f"{mpi.name} np={size}: same modules pass: {same}  (raw outputs: {out / mpi.name / f'np{size}'})", flush=True)
    return not differ, totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2, help="ranks per job (default 2)")
    parser.add_argument("--mpi", choices=("mpich", "impi", "both"), default="both")
    parser.add_argument("--modules", help="comma-separated test modules, e.g. test_comm,test_rma (default: all)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per job before it is killed")
    parser.add_argument("--impi-venv", help="an Intel MPI venv (impi-rt and mpi4py installed)")
    parser.add_argument("--out", help="folder for the raw outputs (default: a new one under /tmp)")
    args = parser.parse_args()
    modules = [m.strip().removesuffix(".py") for m in args.modules.split(",")] if args.modules else None
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="mpi4py-suite-out-"))
    out.mkdir(parents=True, exist_ok=True)
    mpis = {"mpich": [mpich], "impi": [lambda: impi(args.impi_venv)]}.get(args.mpi)
    if mpis is None:
        mpis = [mpich, lambda: impi(args.impi_venv)]
    print(f"{os.cpu_count()} CPUs; per-job timeout {args.timeout:g} s; raw outputs in {out}", flush=True)
    verdicts = []
    for make in mpis:
        mpi = make()
        same, _ = compare(mpi, args.np, modules, args.timeout, out)
        verdicts.append(f"{mpi.name}: {'yes' if same else 'no'}")
    print(f"\nsame modules pass ({args.np} ranks): {', '.join(verdicts)}")
    sys.exit(0 if all(v.endswith("yes") for v in verdicts) else 1)


if __name__ == "__main__":
    main()
