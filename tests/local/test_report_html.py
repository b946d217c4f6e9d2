"""`mpilaunch report`: the picture of a real failed job, as a real browser shows it.

An 8-rank job on two hosts (two agents of this machine) in which rank 3 fails once every rank
has started and rank 6 runs on until the abort kills it: its --report-json document becomes a
page, which headless Chromium (Debian's `chromium`) renders; the test reads the DOM Chromium
built and the screenshot it took. Then the PNG timeline (where matplotlib is installed), the
PNG refused without it, and bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Launcher
from tests.pagedom import Element, parse, png_colours, png_size

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--force-color-profile=srgb", "--hide-scrollbars"]  # fmt: skip
# Rank 3 fails after 2 s, when every rank has started; rank 6 would sleep 30 s; the rest end at 0.3 s.
RANKS = (
    "case $RANK in "
    '3) sleep 2; echo "rank 3: loading data" >&2; echo "rank 3: data/shard-3.bin not found" >&2; exit 3;; '
    "6) i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; sleep 30;; "
    "*) sleep 0.3;; esac"
)
GREEN, RED, ORANGE = (0x2E, 0x9D, 0x4F), (0xD6, 0x2F, 0x2F), (0xF0, 0xA0, 0x30)  # picture/reading.OUTCOMES


def failed_job(launcher: Launcher, tmp_path: Path) -> Path:
    report = tmp_path / "run.json"
    args = ["--launcher", "local", "-H", "node1:4,node2:4", "-n", "8", "--report-json", str(report)]
    proc = launcher.run(*args, "sh", "-c", RANKS, timeout=60)
    assert proc.returncode == 3, proc.stderr.decode()
    return report


def chromium(launcher: Launcher, tmp_path: Path, *args: str) -> bytes:
    """Run Chromium headless (in its own process group, tagged as the test's jobs are, so that
    the launcher fixture finds anything it leaves); its stdout."""
    if CHROMIUM is None:
        pytest.skip("no chromium here (Debian's `chromium` package)")
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
    argv = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args]
    pipe = subprocess.PIPE
    proc = subprocess.Popen(argv, stdout=pipe, stderr=pipe, env=launcher.env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, err.decode()[-2000:]
    return out


def no_network(page: Element) -> None:
    """Nothing on the page loads anything: no script, link, image or frame, no src/href/action
    to a URL, no url() or @import in its style."""
    for element in page.walk():
        assert element.tag not in ("script", "link", "img", "iframe", "object", "embed", "base"), element.tag
        for name, value in element.attrs.items():
            assert name not in ("src", "srcset", "href", "action", "poster", "data"), (element.tag, name, value)
            assert "http:" not in value and "https:" not in value and "//" not in value, (element.tag, name, value)
    style = "".join(e.text() for e in page.find_all("style"))
    assert "url(" not in style and "@import" not in style


def test_the_page_of_a_failed_job_in_chromium(launcher: Launcher, tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("no chromium here (Debian's `chromium` package)")
    report = failed_job(launcher, tmp_path)
    page_file = tmp_path / "report.html"
    made = launcher.run("report", str(report), "-o", str(page_file))
    assert (made.returncode, made.stdout, made.stderr) == (0, f"mpilaunch report: wrote {page_file}\n".encode(), b"")
    no_network(parse(page_file.read_text()))

    dom = chromium(launcher, tmp_path, "--dump-dom", page_file.as_uri()).decode()
    page = parse(dom)
    assert page.find_all("tbody"), "the DOM is not one a browser built (it adds <tbody>)"
    no_network(page)
    rows = page.find_all("tr", "rank")
    assert [r.attrs["data-rank"] for r in rows] == [str(r) for r in range(8)]
    assert [r.attrs["data-host"] for r in rows] == ["node1"] * 4 + ["node2"] * 4
    assert [h.text() for h in page.find_all("tr", "host")] == ["node1: 4 ranks, 4 slots", "node2: 4 ranks, 4 slots"]
    outcomes = {r.attrs["data-rank"]: (r.attrs["data-outcome"], r.find_all("td")[2].text()) for r in rows}
    assert outcomes.pop("3") == ("failed", "exit 3")
    assert outcomes.pop("6") == ("killed", "SIGTERM, killed")
    assert set(outcomes.values()) == {("ok", "exit 0")}
    assert len(rows[3].find_all("div", "bar")) == 1 and len(rows[6].find_all("div", "bar")) == 1

    failure = page.find("section", id="failure")
    assert failure.find("h2").text() == "First failure: rank 3 on node1: exit 3"  # a shell: no exception known
    assert failure.find("pre", "stderr").text() == "rank 3: loading data\nrank 3: data/shard-3.bin not found"
    long = [r.attrs["data-rank"] for r in rows if "long" in r.classes]
    assert "6" in long and "3" in long  # ran 2 s where most ran 0.3 s
    standout = page.find("section", id="standout").text()
    assert "rank 3 on node1 failed: exit 3" in standout and "rank 6 on node2 ran" in standout

    shot = tmp_path / "shot.png"
    chromium(
        launcher, tmp_path, f"--screenshot={shot}", "--window-size=1200,1400", page_file.as_uri()
    )  # the whole table, whatever the command's wrapping
    picture = shot.read_bytes()
    assert png_size(picture) == (1200, 1400)
    colours = png_colours(picture)
    for colour in (GREEN, RED, ORANGE):  # the bars, not only the legend's 14x10 swatches
        assert colours.get(colour, 0) > 1000, colour


def test_the_png_timeline(launcher: Launcher, tmp_path: Path) -> None:
    probe = subprocess.run([launcher.argv()[0], "-c", "import matplotlib"], capture_output=True, env=launcher.env)
    if probe.returncode != 0:
        pytest.skip("matplotlib is not installed (pip install 'mpilaunch[report]')")
    report = failed_job(launcher, tmp_path)
    made = launcher.run("report", str(report), "-o", "report.png")
    assert (made.returncode, made.stderr) == (0, b"")
    assert made.stdout.decode() == f"mpilaunch report: wrote {tmp_path / 'report.png'}\n"  # where, absolute
    picture = (tmp_path / "report.png").read_bytes()
    width, height = png_size(picture)
    assert width == 1200 and height > 200
    colours = png_colours(picture)
    for colour in (GREEN, RED, ORANGE):
        assert colours.get(colour, 0) > 100, colour


PYTHON_RANKS = """
import os, sys, time
if os.environ["RANK"] == "1":
    time.sleep(0.5)
    open("data.csv")
"""


def test_the_page_names_the_python_exception_in_chromium(launcher: Launcher, tmp_path: Path) -> None:
    """A rank that dies of FileNotFoundError: the page's title and its first failure's heading,
    as Chromium renders them, name the exception, not `exit 1` (issue "The front door")."""
    if CHROMIUM is None:
        pytest.skip("no chromium here (Debian's `chromium` package)")
    (tmp_path / "ranks.py").write_text(PYTHON_RANKS)
    report = tmp_path / "run.json"
    proc = launcher.run("-n", "2", "--report-json", str(report), launcher.argv()[0], "ranks.py", timeout=60)
    assert proc.returncode == 1, proc.stderr.decode()
    assert launcher.run("report", str(report), "-o", "report.html").returncode == 0
    page = parse(chromium(launcher, tmp_path, "--dump-dom", (tmp_path / "report.html").as_uri()).decode())
    cause = "FileNotFoundError: [Errno 2] No such file or directory: 'data.csv'"
    assert page.find("title").text() == f"mpilaunch: failed, rank 1: {cause} (2 ranks)"
    assert page.find("section", id="failure").find("h2").text() == f"First failure: rank 1 on localhost: {cause}"
    assert "ended by exit 1" in page.find("section", id="failure").text()
    shot = tmp_path / "shot.png"
    chromium(launcher, tmp_path, f"--screenshot={shot}", "--window-size=1200,900", (tmp_path / "report.html").as_uri())
    assert png_size(shot.read_bytes()) == (1200, 900) and png_colours(shot.read_bytes()).get(RED, 0) > 1000


def minimal_report(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"schema": 1, "outcome": "success", "exit_status": 0, "ranks": []}))
    return path


def test_a_png_without_matplotlib_is_refused_in_one_line(launcher: Launcher, tmp_path: Path) -> None:
    hidden = tmp_path / "hidden"
    (hidden / "matplotlib").mkdir(parents=True)
    (hidden / "matplotlib" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    path = f"{hidden}{os.pathsep}{launcher.env.get('PYTHONPATH', '')}"
    proc = launcher.run("report", str(minimal_report(tmp_path)), "-o", "x.png", env={"PYTHONPATH": path})
    assert proc.returncode == 2
    assert proc.stderr.decode() == "mpilaunch: report: -o x.png needs matplotlib: pip install 'mpilaunch[report]'\n"
    assert not (tmp_path / "x.png").exists()


BAD = {
    "missing": (["nothing.json", "-o", "r.html"],
                "report: nothing.json: cannot read --report-json document: No such file or directory"),
    "not json": (["text.json", "-o", "r.html"], "report: text.json is not a --report-json document (not JSON: "),
    "not utf-8": (["latin.json", "-o", "r.html"], "report: latin.json:2: not UTF-8 text"),
    "other json": (["other.json", "-o", "r.html"],
                   'report: other.json is not a --report-json document (no "schema" and "ranks")'),
    "suffix": (["tiny.json", "-o", "r.pdf"], "report: -o r.pdf: the output must end in .html or .png"),
    "no -o": (["tiny.json"], "usage: mpilaunch report RUN.json -o OUT.html|OUT.png"),
    "a folder": (["tiny.json", "-o", "folder.html"],
                 "report: cannot write folder.html: a directory, not a regular file"),
    "under a file": (["tiny.json", "-o", "text.json/r.html"], "report: cannot write text.json/r.html: Not a directory"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line(launcher: Launcher, tmp_path: Path, case: str) -> None:
    minimal_report(tmp_path)
    (tmp_path / "text.json").write_text("rank 0 said hello\n")
    (tmp_path / "other.json").write_text('{"ranks": 3}\n')
    (tmp_path / "latin.json").write_bytes(b'{"schema": 1,\n"ranks": ["caf\xe9"]}\n')
    (tmp_path / "folder.html").mkdir()
    args, line = BAD[case]
    proc = launcher.run("report", *args)
    err = proc.stderr.decode()
    assert (proc.returncode, proc.stdout) == (2, b"")
    assert err.startswith(f"mpilaunch: {line}") and err.count("\n") == 1, err
    assert not (tmp_path / "r.html").exists()


def test_help(launcher: Launcher) -> None:
    proc = launcher.run("report", "--help")
    assert proc.returncode == 0 and proc.stdout.decode().startswith("usage: mpilaunch report RUN.json -o ")
