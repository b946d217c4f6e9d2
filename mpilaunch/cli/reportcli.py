"""`mpilaunch report RUN.json -o report.html|report.png`: a picture of a finished run from its
--report-json document. This module reads and writes the files; picture/ draws."""

from __future__ import annotations

import json
import os

from mpilaunch.errors import LaunchError
from mpilaunch.plan.textfiles import read_text

USAGE = "usage: mpilaunch report RUN.json -o OUT.html|OUT.png  (a picture of a --report-json document)"
LIMIT = 1 << 30  # a report of 65,536 ranks is tens of MiB


def run_report(args: list[str]) -> int:
    if args in (["--help"], ["-h"]):
        print(USAGE)
        return 0
    source, target = arguments(args)
    suffix = os.path.splitext(target)[1].lower()
    if suffix not in (".html", ".htm", ".png"):
        raise LaunchError(f"report: -o {target}: the output must end in .html or .png")
    document = read_document(source)
    if suffix == ".png":
        try:
            from mpilaunch.picture.chart import png

            data = png(document)
        except ImportError:
            raise LaunchError(f"report: -o {target} needs matplotlib: pip install 'mpilaunch[report]'") from None
    else:
        from mpilaunch.picture.page import render

        data = render(document).encode("utf-8")
    from mpilaunch.host.files import write_regular

    error = write_regular(target, data)  # the picture, whole or not at all
    if error:
        raise LaunchError(f"report: {error}")
    print(f"mpilaunch report: wrote {os.path.abspath(target)}")
    return 0


def arguments(args: list[str]) -> tuple[str, str]:
    """(RUN.json, OUT)."""
    source, target, rest = None, None, list(args)
    while rest:
        word = rest.pop(0)
        if word in ("-o", "--output") and rest:
            target = rest.pop(0)
        elif word.startswith("--output="):
            target = word.split("=", 1)[1]
        elif word.startswith("-") or source is not None:
            raise LaunchError(USAGE)
        else:
            source = word
    if not source or not target:
        raise LaunchError(USAGE)
    return source, target


def read_document(path: str) -> dict:
    """The report's document, or one line on why it is not one."""
    try:
        data = read_text(path, "--report-json document", LIMIT)
    except LaunchError as exc:
        raise LaunchError(f"report: {exc}") from None
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise LaunchError(f"report: {path} is not a --report-json document (not JSON: {exc})") from None
    if not isinstance(document, dict) or "schema" not in document or not isinstance(document.get("ranks"), list):
        raise LaunchError(f'report: {path} is not a --report-json document (no "schema" and "ranks")')
    return document
