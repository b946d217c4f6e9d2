#!/usr/bin/env python3
"""Regenerate openmpi41_truth.json by running the real Open MPI 4.1 mpirun.

Standalone, stdlib only.  Needs Debian's ``openmpi-bin`` (Open MPI 4.1.x,
``/usr/bin/mpirun.openmpi``).  Nothing is launched on other machines:

Recipe for "several hosts on one machine"
-----------------------------------------
* Made-up host names (``ompifake-a`` ...) are given with ``-H`` or a hostfile.
  They must not resolve to a local address (otherwise Open MPI treats them as
  the local node and does not use the launch agent).
* ``--mca plm_rsh_agent <fake_ssh>``: Open MPI runs
  ``<fake_ssh> <host> "<env setup> ; /usr/bin/orted" -mca ess "env" ...`` for
  every remote host.  The fake agent drops the host argument, exports it as
  ``OMPI_TRUTH_HOST`` and runs the rest locally with ``sh -c "$*"``.  The orted
  for that "host" (and thus every rank it forks) inherits OMPI_TRUTH_HOST, so
  each rank can tell which host Open MPI placed it on.
* ``--mca rtc_hwloc_vmhole none``: without it, ~10% of runs die with a SIGSEGV
  in an orted (hwloc_shmem_topology_write, several orteds on one machine).
* mpirun's own node (this machine) is never listed, so it gets no ranks; but
  its core count is added to OMPI_UNIVERSE_SIZE (see "hnp_cores" in the JSON).

Usage:  python3 openmpi41_truth.py [-o OUT.json] [--mpirun PATH] [--print]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "openmpi41_truth.json")

VARS = [
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_COMM_WORLD_NODE_RANK",
    "OMPI_UNIVERSE_SIZE",
    "OMPI_NUM_APP_CTX",
    "OMPI_APP_CTX_NUM_PROCS",
    "OMPI_FIRST_RANKS",
    "OMPI_MCA_orte_app_num",
]

FAKE_PREFIX = "ompifake-"

FAKE_AGENT = """#!/bin/sh
# Fake ssh for Open MPI's plm_rsh_agent: $1 is the host, the rest is the
# remote command line (already shell-quoted by Open MPI).  Run it locally.
OMPI_TRUTH_HOST="$1"; export OMPI_TRUTH_HOST
shift
exec sh -c "$*"
"""

# What every rank runs (one line, one write).
RANK_PROG = 'echo "OMPITRUTH|host=${OMPI_TRUTH_HOST:-LOCAL}|' + "|".join(f"{v}=${{{v}-UNSET}}" for v in VARS) + '"'

# ---------------------------------------------------------------------------
# Scenarios.  hosts: list of [name, slots or None, max_slots or None].
# "hostspec": "H" -> passed with -H name[:slots],...;  "hostfile" -> a hostfile
# with lines "name [slots=N] [max_slots=M]" (one per entry, in order).
# args: options (mpilaunch-equivalent) placed before the application(s).
# apps: list of np per app context; None in the list means "no -np".
# ---------------------------------------------------------------------------
A22 = [["a", 2, None], ["b", 2, None]]
A312 = [["a", 3, None], ["b", 1, None], ["c", 2, None]]
A2222 = [["a", 2, None], ["b", 2, None], ["c", 2, None], ["d", 2, None]]
A31 = [["a", 3, None], ["b", 1, None]]
MAX23 = [["a", 2, 3], ["b", 2, 3]]

SCENARIOS = [
    # default mapping (by slot)
    dict(name="byslot_np4_a2b2", hosts=A22, args=["-np", "4"]),
    dict(name="byslot_np3_a2b2", hosts=A22, args=["-np", "3"]),
    dict(name="byslot_np_omitted_a2b2", hosts=A22, args=[]),
    dict(name="byslot_np6_a3b1c2", hosts=A312, args=["-np", "6"]),
    dict(name="byslot_np4_a3b1c2", hosts=A312, args=["-np", "4"]),
    dict(name="byslot_np_omitted_a3b1c2", hosts=A312, args=[]),
    dict(name="byslot_np8_a2b2c2d2", hosts=A2222, args=["-np", "8"]),
    dict(name="byslot_np5_a2b2c2d2", hosts=A2222, args=["-np", "5"]),
    dict(name="byslot_np_omitted_a2b2c2d2", hosts=A2222, args=[]),
    dict(name="byslot_explicit_np3_a2b2", hosts=A22, args=["--map-by", "slot", "-np", "3"]),
    # map by node
    dict(name="bynode_np3_a2b2", hosts=A22, args=["--map-by", "node", "-np", "3"]),
    dict(name="bynode_np4_a2b2", hosts=A22, args=["--map-by", "node", "-np", "4"]),
    dict(name="bynode_np5_a2b2_noover", hosts=A22, args=["--map-by", "node", "-np", "5"]),
    dict(name="bynode_np5_a2b2_over", hosts=A22, args=["--map-by", "node", "--oversubscribe", "-np", "5"]),
    dict(name="bynode_np6_a3b1c2", hosts=A312, args=["--map-by", "node", "-np", "6"]),
    dict(name="bynode_np5_a3b1c2", hosts=A312, args=["--map-by", "node", "-np", "5"]),
    dict(name="bynode_np_omitted_a3b1c2", hosts=A312, args=["--map-by", "node"]),
    dict(name="bynode_np8_a3b1c2_over", hosts=A312, args=["--map-by", "node", "--oversubscribe", "-np", "8"]),
    dict(name="bynode_np5_a2b2c2d2", hosts=A2222, args=["--map-by", "node", "-np", "5"]),
    dict(name="bynode_np8_a2b2c2d2", hosts=A2222, args=["--map-by", "node", "-np", "8"]),
    dict(name="bynode_np4_a1b3", hosts=[["a", 1, None], ["b", 3, None]], args=["--map-by", "node", "-np", "4"]),
    dict(name="bynode_np3_a1b3", hosts=[["a", 1, None], ["b", 3, None]], args=["--map-by", "node", "-np", "3"]),
    dict(
        name="bynode_np7_a1b3c3",
        hosts=[["a", 1, None], ["b", 3, None], ["c", 3, None]],
        args=["--map-by", "node", "-np", "7"],
    ),
    dict(
        name="bynode_np9_a1b3_over",
        hosts=[["a", 1, None], ["b", 3, None]],
        args=["--map-by", "node", "--oversubscribe", "-np", "9"],
    ),
    # ppr / npernode
    dict(name="ppr1node_a2b2", hosts=A22, args=["--map-by", "ppr:1:node"]),
    dict(name="ppr2node_a2b2", hosts=A22, args=["--map-by", "ppr:2:node"]),
    dict(name="ppr1node_a3b1c2", hosts=A312, args=["--map-by", "ppr:1:node"]),
    dict(name="ppr2node_a3b1c2", hosts=A312, args=["--map-by", "ppr:2:node"]),
    dict(name="ppr2node_a3b1c2_over", hosts=A312, args=["--map-by", "ppr:2:node", "--oversubscribe"]),
    dict(name="ppr1node_np1_a2b2", hosts=A22, args=["--map-by", "ppr:1:node", "-np", "1"]),
    dict(name="ppr2node_np3_a2b2", hosts=A22, args=["--map-by", "ppr:2:node", "-np", "3"]),
    dict(name="npernode1_a2b2", hosts=A22, args=["--npernode", "1"]),
    dict(name="npernode2_a2b2", hosts=A22, args=["--npernode", "2"]),
    dict(name="npernode1_a3b1c2", hosts=A312, args=["--npernode", "1"]),
    dict(name="npernode2_a3b1c2", hosts=A312, args=["--npernode", "2"]),
    dict(name="npernode2_np3_a2b2c2d2", hosts=A2222, args=["--npernode", "2", "-np", "3"]),
    dict(name="npernode1_np3_a2b2c2d2", hosts=A2222, args=["--npernode", "1", "-np", "3"]),
    # oversubscription by slot
    dict(name="byslot_over_np5_a2b2", hosts=A22, args=["--oversubscribe", "-np", "5"]),
    dict(name="byslot_over_np6_a2b2", hosts=A22, args=["--oversubscribe", "-np", "6"]),
    dict(name="byslot_over_np7_a2b2", hosts=A22, args=["--oversubscribe", "-np", "7"]),
    dict(name="byslot_over_np9_a2b2", hosts=A22, args=["--oversubscribe", "-np", "9"]),
    dict(name="byslot_over_np5_a3b1", hosts=A31, args=["--oversubscribe", "-np", "5"]),
    dict(name="byslot_over_np6_a3b1", hosts=A31, args=["--oversubscribe", "-np", "6"]),
    dict(name="byslot_over_np7_a3b1", hosts=A31, args=["--oversubscribe", "-np", "7"]),
    dict(name="byslot_over_np9_a3b1", hosts=A31, args=["--oversubscribe", "-np", "9"]),
    dict(name="byslot_over_np7_a3b1c2", hosts=A312, args=["--oversubscribe", "-np", "7"]),
    dict(name="byslot_over_np8_a3b1c2", hosts=A312, args=["--oversubscribe", "-np", "8"]),
    dict(name="byslot_over_np10_a3b1c2", hosts=A312, args=["--oversubscribe", "-np", "10"]),
    dict(name="byslot_over_np13_a3b1c2", hosts=A312, args=["--oversubscribe", "-np", "13"]),
    dict(name="byslot_over_np10_a2b2c2d2", hosts=A2222, args=["--oversubscribe", "-np", "10"]),
    dict(name="byslot_over_np3_a1", hosts=[["a", 1, None]], args=["--oversubscribe", "-np", "3"]),
    # not enough slots
    dict(name="byslot_noover_np5_a2b2", hosts=A22, args=["-np", "5"]),
    dict(name="byslot_noover_np7_a3b1c2", hosts=A312, args=["-np", "7"]),
    # hostfile with max_slots
    dict(name="hf_max_np4", hosts=MAX23, hostspec="hostfile", args=["-np", "4"]),
    dict(name="hf_max_np5_noover", hosts=MAX23, hostspec="hostfile", args=["-np", "5"]),
    dict(name="hf_max_np5_over", hosts=MAX23, hostspec="hostfile", args=["--oversubscribe", "-np", "5"]),
    dict(name="hf_max_np6_over", hosts=MAX23, hostspec="hostfile", args=["--oversubscribe", "-np", "6"]),
    dict(name="hf_max_np7_over", hosts=MAX23, hostspec="hostfile", args=["--oversubscribe", "-np", "7"]),
    dict(name="hf_max_np_omitted", hosts=MAX23, hostspec="hostfile", args=[]),
    dict(
        name="hf_max_bynode_np6_over",
        hosts=MAX23,
        hostspec="hostfile",
        args=["--map-by", "node", "--oversubscribe", "-np", "6"],
    ),
    dict(
        name="hf_mixed_max_np5_over",
        hosts=[["a", 2, 3], ["b", 2, None]],
        hostspec="hostfile",
        args=["--oversubscribe", "-np", "5"],
    ),
    dict(
        name="hf_mixed_max_np7_over",
        hosts=[["a", 2, 3], ["b", 2, None]],
        hostspec="hostfile",
        args=["--oversubscribe", "-np", "7"],
    ),
    dict(
        name="hf_max_eq_slots_np5_over",
        hosts=[["a", 2, 2], ["b", 2, 2]],
        hostspec="hostfile",
        args=["--oversubscribe", "-np", "5"],
    ),
    dict(name="hf_max_eq_slots_np5_noover", hosts=[["a", 2, 2], ["b", 2, 2]], hostspec="hostfile", args=["-np", "5"]),
    dict(name="hf_maxonly_np_omitted", hosts=[["a", None, 3], ["b", None, 1]], hostspec="hostfile", args=[]),
    dict(
        name="hf_maxonly_np5_over",
        hosts=[["a", None, 3], ["b", None, 1]],
        hostspec="hostfile",
        args=["--oversubscribe", "-np", "5"],
    ),
    dict(name="hf_plain_a2b2_np4", hosts=A22, hostspec="hostfile", args=["-np", "4"]),
    dict(name="hf_plain_a2b2_over_np6", hosts=A22, hostspec="hostfile", args=["--oversubscribe", "-np", "6"]),
    # MPMD
    dict(name="mpmd_1_3_a2b2", hosts=A22, args=[], apps=[1, 3]),
    dict(name="mpmd_2_2_bynode_a2b2", hosts=A22, args=["--map-by", "node"], apps=[2, 2]),
    dict(name="mpmd_2_2_a2b2", hosts=A22, args=[], apps=[2, 2]),
    dict(name="mpmd_1_2_3_a2b2c2d2", hosts=A2222, args=[], apps=[1, 2, 3]),
    dict(name="mpmd_1_2_3_bynode_a2b2c2d2", hosts=A2222, args=["--map-by", "node"], apps=[1, 2, 3]),
    dict(name="mpmd_3_3_over_a2b2", hosts=A22, args=["--oversubscribe"], apps=[3, 3]),
    dict(name="mpmd_3_3_bynode_over_a2b2", hosts=A22, args=["--map-by", "node", "--oversubscribe"], apps=[3, 3]),
    dict(name="mpmd_2_3_over_a3b1", hosts=A31, args=["--oversubscribe"], apps=[2, 3]),
    dict(name="mpmd_3_1_bynode_a3b3", hosts=[["a", 3, None], ["b", 3, None]], args=["--map-by", "node"], apps=[3, 1]),
    dict(
        name="mpmd_4_1_bynode_a3b3c3",
        hosts=[["a", 3, None], ["b", 3, None], ["c", 3, None]],
        args=["--map-by", "node"],
        apps=[4, 1],
    ),
    dict(name="mpmd_5_1_over_a2b2", hosts=A22, args=["--oversubscribe"], apps=[5, 1]),
    dict(name="mpmd_3_2_a3b3", hosts=[["a", 3, None], ["b", 3, None]], args=[], apps=[3, 2]),
    dict(name="mpmd_3_2_noover_a2b2", hosts=A22, args=[], apps=[3, 2]),
    # Open MPI's other placement words (issue "Drop-in where the tools look", 2026-11-26)
    dict(name="rankby_node_byslot_np4", hosts=A22, args=["-np", "4", "--rank-by", "node"]),
    dict(name="rankby_slot_bynode_np4", hosts=A22, args=["-np", "4", "--map-by", "node", "--rank-by", "slot"]),
    dict(name="rankby_node_byslot_np5_a3b1c2", hosts=A312, args=["-np", "5", "--rank-by", "node"]),
    dict(name="rankby_slot_bynode_np5_a3b1c2", hosts=A312, args=["-np", "5", "--map-by", "node", "--rank-by", "slot"]),
    dict(name="rankby_core_np4", hosts=A22, args=["-np", "4", "--rank-by", "core"]),
    dict(name="rankby_socket_bynode_np4", hosts=A22, args=["-np", "4", "--map-by", "node", "--rank-by", "socket"]),
    dict(name="rankby_node_mpmd_1_3", hosts=A22, args=["--rank-by", "node"], apps=[1, 3]),
    dict(name="N1_a2b2", hosts=A22, args=["-N", "1"]),
    dict(name="N2_np3_a3b1c2", hosts=A312, args=["-N", "2", "-np", "3"]),
    dict(name="bynode_old_np3_a2b2", hosts=A22, args=["--bynode", "-np", "3"]),
    dict(name="byslot_old_np3_a2b2", hosts=A22, args=["--byslot", "-np", "3"]),
    dict(name="npersocket1_a2b2", hosts=A22, args=["--npersocket", "1"]),
    dict(name="ppr1socket_a2b2", hosts=A22, args=["--map-by", "ppr:1:socket"]),
    dict(name="ppr1node_pe2_a2b2", hosts=A22, args=["--map-by", "ppr:1:node:PE=2"]),
    dict(name="slot_pe1_np3_a2b2", hosts=A22, args=["--map-by", "slot:PE=1", "-np", "3"]),
    dict(name="cpus_per_proc1_np3_a2b2", hosts=A22, args=["--cpus-per-proc", "1", "-np", "3"]),
    dict(name="nooversubscribe_np5_a2b2", hosts=A22, args=["--nooversubscribe", "-np", "5"]),
    dict(name="bynode_oversubscribe_modifier_np5_a2b2", hosts=A22, args=["--map-by", "node:OVERSUBSCRIBE", "-np", "5"]),
    # repeated hosts / no slot count
    dict(name="H_repeat_a_a_b", hosts=[["a", None, None], ["a", None, None], ["b", None, None]], args=[]),
    dict(name="H_repeat_a_a_b_np3", hosts=[["a", None, None], ["a", None, None], ["b", None, None]], args=["-np", "3"]),
    dict(name="H_repeat_a2_a1_b1", hosts=[["a", 2, None], ["a", 1, None], ["b", 1, None]], args=[]),
    dict(
        name="hf_repeat_a2_a2_b2", hosts=[["a", 2, None], ["a", 2, None], ["b", 2, None]], hostspec="hostfile", args=[]
    ),
    dict(
        name="hf_repeat_a2_a2_b2_np5",
        hosts=[["a", 2, None], ["a", 2, None], ["b", 2, None]],
        hostspec="hostfile",
        args=["-np", "5"],
    ),
    dict(
        name="hf_repeat_a_a_b_noslots",
        hosts=[["a", None, None], ["a", None, None], ["b", None, None]],
        hostspec="hostfile",
        args=[],
    ),
    dict(
        name="hf_repeat_a_a_a_b_noslots",
        hosts=[["a", None, None], ["a", None, None], ["a", None, None], ["b", None, None]],
        hostspec="hostfile",
        args=[],
    ),
    dict(name="hf_a_noslots_np3", hosts=[["a", None, None]], hostspec="hostfile", args=["-np", "3"]),
    dict(name="H_a_noslots", hosts=[["a", None, None]], args=[]),
    dict(name="H_a_noslots_np2", hosts=[["a", None, None]], args=["-np", "2"]),
    dict(name="H_a_b_noslots", hosts=[["a", None, None], ["b", None, None]], args=[]),
    dict(name="hf_a_noslots", hosts=[["a", None, None]], hostspec="hostfile", args=[]),
    dict(name="hf_a_b_noslots", hosts=[["a", None, None], ["b", None, None]], hostspec="hostfile", args=[]),
]


def fake(name):
    return FAKE_PREFIX + name


def unfake(name):
    if name.startswith(FAKE_PREFIX):
        return name[len(FAKE_PREFIX) :]
    return name


def find_mpirun(explicit):
    cands = (
        [explicit]
        if explicit
        else ["/usr/bin/mpirun.openmpi", shutil.which("mpirun.openmpi") or "", "/usr/bin/orterun", "/usr/bin/mpirun"]
    )
    for c in cands:
        if c and os.path.exists(c):
            out = subprocess.run([c, "--version"], capture_output=True, text=True)
            txt = out.stdout + out.stderr
            if "OpenRTE" in txt or "Open MPI" in txt:
                return c, txt.strip().splitlines()[0]
    sys.exit("Open MPI mpirun not found (apt-get install openmpi-bin)")


def first_error_line(stderr):
    for line in stderr.splitlines():
        s = line.strip()
        if not s or set(s) == {"-"}:
            continue
        if re.match(r"^\[[^\]]*:\d+\] ", s):
            # racy "[host:pid] PMIX ERROR ..." / "plm:rsh: Warning: setpgid"
            # noise some runs print before the real message
            continue
        return s
    return None


def clean_error(stderr, tmp=None):
    """stderr with fake host names mapped back to a, b, c, d."""
    if tmp:
        stderr = stderr.replace(tmp + os.sep, "")
    return stderr.replace(FAKE_PREFIX, "")


def build_cmd(mpirun, sc, tmp, agent):
    cmd = [mpirun, "--allow-run-as-root", "--mca", "plm_rsh_agent", agent, "--mca", "rtc_hwloc_vmhole", "none"]
    hostspec = sc.get("hostspec", "H")
    if hostspec == "H":
        parts = []
        for name, slots, _mx in sc["hosts"]:
            parts.append(fake(name) + ("" if slots is None else f":{slots}"))
        cmd += ["-H", ",".join(parts)]
    else:
        hf = os.path.join(tmp, sc["name"] + ".hostfile")
        with open(hf, "w") as f:
            for name, slots, mx in sc["hosts"]:
                line = fake(name)
                if slots is not None:
                    line += f" slots={slots}"
                if mx is not None:
                    line += f" max_slots={mx}"
                f.write(line + "\n")
        cmd += ["--hostfile", hf]
    cmd += sc["args"]
    prog = ["sh", "-c", RANK_PROG]
    apps = sc.get("apps")
    if not apps:
        cmd += prog
    else:
        for i, np_ in enumerate(apps):
            if i:
                cmd.append(":")
            if np_ is not None:
                cmd += ["-np", str(np_)]
            cmd += prog
    return cmd


def run_scenario(mpirun, sc, tmp, agent, tries=4):
    cmd = build_cmd(mpirun, sc, tmp, agent)
    for _attempt in range(tries):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp, stdin=subprocess.DEVNULL)
        transient = "Segmentation fault" in p.stderr or "unable to reliably start" in p.stderr
        if not transient:
            break
    ranks = []
    for line in p.stdout.splitlines():
        if not line.startswith("OMPITRUTH|"):
            continue
        d = dict(kv.split("=", 1) for kv in line.split("|")[1:])
        r = {"rank": int(d["OMPI_COMM_WORLD_RANK"]), "host": unfake(d["host"])}
        for v in VARS:
            val = d.get(v, "UNSET")
            r[v] = val
        ranks.append(r)
    ranks.sort(key=lambda r: r["rank"])
    err = None if p.returncode == 0 else first_error_line(p.stderr)
    shown = []
    for c in cmd:
        if c == agent:
            c = "FAKE_SSH"
        elif c == RANK_PROG:
            c = "<print env>"
        elif c.startswith(tmp):
            c = "HOSTFILE"
        shown.append(c.replace(FAKE_PREFIX, ""))
    return {
        "name": sc["name"],
        "hostspec": sc.get("hostspec", "H"),
        "hosts": sc["hosts"],
        "args": sc["args"],
        "apps": sc.get("apps"),
        "mpirun_cmdline": shown,
        "returncode": p.returncode,
        "error": err and clean_error(err),
        "error_text": None if p.returncode == 0 else clean_error(p.stderr, tmp),
        "ranks": ranks,
    }


def hnp_cores(mpirun, tmp):
    p = subprocess.run(
        [mpirun, "--allow-run-as-root", "sh", "-c", "echo $OMPI_COMM_WORLD_SIZE"],
        capture_output=True,
        text=True,
        cwd=tmp,
        timeout=60,
    )
    lines = p.stdout.split()
    return int(lines[0]) if lines else None


def fmt_table(res):
    out = [
        "== {}  hosts={}  args={} apps={} rc={}".format(
            res["name"], res["hosts"], " ".join(res["args"]), res["apps"], res["returncode"]
        )
    ]
    if res["error"]:
        out.append("   ERROR: " + res["error"])
    for r in res["ranks"]:
        out.append(
            f"   r{r['rank']:<2d} {r['host']}  size={r['OMPI_COMM_WORLD_SIZE']}"
            f" lr={r['OMPI_COMM_WORLD_LOCAL_RANK']} ls={r['OMPI_COMM_WORLD_LOCAL_SIZE']}"
            f" nr={r['OMPI_COMM_WORLD_NODE_RANK']} univ={r['OMPI_UNIVERSE_SIZE']}"
            f" nac={r['OMPI_NUM_APP_CTX']} acnp={r['OMPI_APP_CTX_NUM_PROCS']}"
            f" first={r['OMPI_FIRST_RANKS']} app={r['OMPI_MCA_orte_app_num']}"
        )
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", default=DEFAULT_OUT)
    ap.add_argument("--mpirun")
    ap.add_argument("--print", action="store_true", help="print a table")
    ap.add_argument("--only", help="regex of scenario names to run")
    a = ap.parse_args()
    mpirun, version = find_mpirun(a.mpirun)
    tmp = tempfile.mkdtemp(prefix="ompitruth-")
    try:
        agent = os.path.join(tmp, "fake_ssh.sh")
        with open(agent, "w") as f:
            f.write(FAKE_AGENT)
        os.chmod(agent, 0o755)
        cores = hnp_cores(mpirun, tmp)
        results = []
        for sc in SCENARIOS:
            if a.only and not re.search(a.only, sc["name"]):
                continue
            res = run_scenario(mpirun, sc, tmp, agent)
            results.append(res)
            if a.print:
                print(fmt_table(res), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {
        "generator": "tests/data/openmpi41_truth.py",
        "mpirun_version": version,
        "recipe": (
            "mpirun --allow-run-as-root --mca plm_rsh_agent FAKE_SSH "
            "--mca rtc_hwloc_vmhole none -H <fake hosts> ...; FAKE_SSH = "
            '\'#!/bin/sh\\nOMPI_TRUTH_HOST="$1"; export OMPI_TRUTH_HOST; '
            'shift; exec sh -c "$*"\''
        ),
        "hnp_cores": cores,
        "notes": [
            "hosts: [name, slots (null = not given), max_slots (null = not given)]; "
            "hostspec 'H' = mpirun -H name[:slots],...; 'hostfile' = one line per "
            "entry 'name [slots=N] [max_slots=M]'.",
            "args: options before the program; apps: np per app context "
            "(MPMD, 'prog : prog'), null = single app without extra -np.",
            "OMPI_UNIVERSE_SIZE here = sum of slots of the listed hosts + hnp_cores, "
            "because mpirun's own node (not listed, gets no ranks) is counted "
            "with its core count.  Listing the local node in -H makes it "
            "exactly the sum of listed slots.",
            "error: first non-separator line of mpirun's stderr when rc != 0; error_text: the whole stderr.",
            "All env values are the raw strings the rank saw.",
            "OMPI_FIRST_RANKS is space separated and is all zeros in 4.1.4 "
            "(e.g. '0 0' for 2 apps): a bug, the real first ranks are not filled in. "
            "OMPI_APP_CTX_NUM_PROCS is the space-separated np of every app context.",
            "OMPI_COMM_WORLD_NODE_RANK == OMPI_COMM_WORLD_LOCAL_RANK in every "
            "scenario (index of the rank among the ranks on its host, in rank "
            "order, over all app contexts).",
            "Oversubscribed by-slot mapping: fill every host to its slots, then "
            "R = leftover procs, each host (in order) gets R // nhosts more and the "
            "first R % nhosts hosts one extra; ranks stay contiguous per host. "
            "max_slots never limits a single mpirun.",
            "MPMD: each later app context starts at the host that holds the highest "
            "rank of the previous app (or the next host after it that still has a "
            "free slot); ranks are still numbered walking hosts in first-use order.",
        ],
        "scenarios": results,
    }
    if a.only:
        print(json.dumps(doc, indent=1))
        return
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {a.out} ({len(results)} scenarios)")


if __name__ == "__main__":
    main()
