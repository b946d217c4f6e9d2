"""A throw-away one-node Slurm cluster on this machine, for tests of the Slurm launch engine.

    with SlurmBed(tmp_dir) as bed:
        bed.run(["srun", "-n2", "hostname"], check=True)

Real daemons, run in the foreground so the pids we hold are theirs: `munged -F` with its own
key and socket, `slurmctld -D` and `slurmd -D`, all reading one generated slurm.conf. Every file
(munge key, socket, slurm.conf, state, spool, logs, pid files) lives in the bed directory; nothing
reads or writes /etc/slurm, /etc/munge, /run/munge or the machine's services. Clients find the
bed through `SLURM_CONF` (in `bed.env`); slurm.conf's `AuthInfo=socket=...` tells every Slurm
program, client or daemon, where the bed's munged listens.

Finding leftovers: the daemons and every client started through `run`/`popen` carry
`SLURMBED_TAG=<bed id>` in their environment. slurmstepd inherits it from slurmd, and tasks get
it from the srun/salloc/sbatch that started them (Slurm exports the caller's environment), so a
job's processes are the tagged ones plus every descendant of a tagged slurmstepd.

Needs root (slurmd starts jobs as their user) and Debian's `slurmctld slurmd slurm-client munge`.
Run `python -m tests.slurmbed` to time a start-up by hand. Stdlib only, no pytest in the class.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from tests.daemonbed import DaemonBed, bed_fixtures, time_by_hand
from tests.procs import (
    below,
    parent_pid,
    pid_alive,
    process_name,
    signal_quietly,
    tagged_processes,
)

TAG_VAR = "SLURMBED_TAG"
SBIN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "salloc", "sbatch", "scancel", "scontrol", "sinfo", "squeue", "munge")
# Inherited from an allocation around the test run, these would make srun join that job instead.
CLIENT_PREFIXES = ("SLURM_", "SRUN_", "SALLOC_", "SBATCH_", "SQUEUE_", "SINFO_", "SCANCEL_", "SCONTROL_")
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"})
_PR_SET_PDEATHSIG = 1


def _find(tool: str) -> str | None:
    """Absolute path of a Slurm/munge program; the daemons live in /usr/sbin, often not on PATH."""
    found = shutil.which(tool) or shutil.which(tool, path=SBIN_PATH)
    return os.path.abspath(found) if found else None


def slurm_available() -> tuple[bool, str]:
    """Whether a SlurmBed can run here, and why not: tests skip with this reason."""
    missing = [tool for tool in (*DAEMONS, *CLIENTS, "slurmstepd") if _find(tool) is None]
    if missing:
        return False, (
            f"not installed: {', '.join(missing)} "
            "(Debian: apt-get install --no-install-recommends slurmctld slurmd slurm-client munge)"
        )
    if os.geteuid() != 0:
        return False, "slurmd must run as root to start jobs (SlurmdUser=root)"
    return True, "ok"


def ancestors(pid: int, limit: int = 64) -> list[tuple[int, str]]:
    """(pid, comm) of a process's parents up to PID 1: how a task shows it runs under slurmstepd."""
    chain = []
    parent = parent_pid(pid)
    while parent > 0 and len(chain) < limit:
        chain.append((parent, process_name(parent)))
        if parent == 1:
            break
        parent = parent_pid(parent)
    return chain


def system_slurm_pids() -> list[int]:
    """Every live slurmctld/slurmd/slurmstepd/munged on the machine, by executable: a check only."""
    names = {"munged", "slurmctld", "slurmd", "slurmstepd"}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            exe = os.path.basename(os.readlink(f"/proc/{entry}/exe"))
        except OSError:
            continue
        # Debian installs the binaries as slurmd-wlm etc. behind update-alternatives links.
        if exe.removesuffix("-wlm") in names and pid_alive(int(entry)):
            found.append(int(entry))
    return sorted(found)


def parse_keyvalues(text: str) -> dict[str, str]:
    """`scontrol show -o` output (Key=Value Key=Value with spaces inside values) as a dict."""
    pairs = re.findall(r"(?:^|\s)([A-Za-z][\w:/.]*)=(.*?)(?=\s+[A-Za-z][\w:/.]*=|\s*$)", text.strip())
    return dict(pairs)


class SlurmBed(DaemonBed):
    """munged + slurmctld + slurmd for one node (this host), a `debug` partition, and client env.

    `start()` (or `with`) writes the key and slurm.conf, starts the daemons in order and returns
    once `sinfo` shows the node idle. `close()` cancels the bed's jobs, kills by pid whatever job
    process is left, then stops slurmd, slurmctld and munged by pid (SIGTERM, SIGKILL after
    `grace` s).

    `cpus`: CPUs the node claims (default: this machine's; slurmd accepts any number with
    `SlurmdParameters=config_overrides`). `task_plugin`: `task/affinity` binds tasks the way a
    real cluster does; `task/none` never binds. `select_parameters`: `CR_Core_Memory` makes
    memory a consumable too, as on many clusters. `kill_wait`: slurm.conf KillWait, seconds from
    SIGTERM to SIGKILL (slurmd waits at least 5). `debug`: the daemons' log level (`debug2` logs
    every signal sent to a task). `extra_conf`: more slurm.conf lines.

    Every daemon gets SIGTERM when the thread that started it exits: start the bed from a thread
    that lives as long as it (the main thread in pytest).
    """

    def __init__(
        self,
        base: str | os.PathLike[str],
        cpus: int | None = None,
        real_memory: int = 1000,
        task_plugin: str = "task/affinity",
        select_parameters: str = "CR_Core",
        kill_wait: int = 2,
        debug: str = "info",
        extra_conf: str = "",
    ) -> None:
        super().__init__(base, workdir="jobs")
        self.tag = uuid.uuid4().hex
        self.node = socket.gethostname().split(".")[0]
        self.cpus = cpus or os.cpu_count() or 1
        self.real_memory = real_memory
        self.task_plugin = task_plugin
        self.select_parameters = select_parameters
        self.kill_wait = kill_wait
        self.debug = debug
        self.extra_conf = extra_conf
        self.user = pwd.getpwuid(os.geteuid()).pw_name
        self.conf = self.base / "slurm.conf"
        self.munge_key = self.base / "munge" / "munge.key"
        self.munge_socket = self.base / "munge" / "munge.socket"
        self.ctld_port = 0
        self.slurmd_port = 0
        self._helpers: dict[str, int] = {}  # slurmscriptd: forked by slurmctld, not by us
        self._topology = ""

    CONTROLLER = "slurmctld"
    STOP_ORDER = ("slurmd", "slurmctld", "munged")
    NEVER_CLASHES = frozenset({"munged"})
    GRACE = 5.0

    # -- life cycle -------------------------------------------------------------------------

    def available(self) -> tuple[bool, str]:
        return slurm_available()

    def _start(self, timeout: float) -> None:
        """Key, config, then munged, slurmctld (until it answers) and slurmd (until the node is idle)."""
        for sub in ("munge", "state", "spool", "log", "run", "jobs"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        (self.base / "munge").chmod(0o700)
        self._kill_stale()
        self._write_munge_key()
        (self.base / "plugstack.conf").write_text("")  # not /etc/slurm/plugstack.conf's SPANK plugins
        self.env = {"SLURM_CONF": str(self.conf), TAG_VAR: self.tag}
        self._topology = self._hardware_topology()
        self._start_munged(timeout)
        self._on_free_ports(
            lambda ctld, slurmd: self._start_slurm(ctld, slurmd, timeout),
            ("slurmd", "slurmctld"),
            "SlurmctldPort/SlurmdPort",
        )

    def remove_jobs(self) -> None:
        """scancel every job of the bed (all are this user's)."""
        ids = self.job_ids()
        if ids:
            self.run(["scancel", *ids], timeout=15)

    def job_settle(self) -> float:
        return self.kill_wait + 3.0

    # -- what tests use ---------------------------------------------------------------------

    def client_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """This process's environment without any Slurm job variables, plus the bed's."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(CLIENT_PREFIXES)}
        env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":" + SBIN_PATH
        env.update(self.env)
        env.update(extra or {})
        return env

    def node_state(self) -> str:
        """The node's state as `sinfo %t` prints it: idle, alloc, mix, down*, unk*..."""
        out = self.run(["sinfo", "-h", "-N", "-n", self.node, "-o", "%t"], timeout=15)
        return out.stdout.strip()

    def job_ids(self) -> list[str]:
        """Ids of the jobs slurmctld still lists as pending or running."""
        out = self.run(["squeue", "-h", "-o", "%i"], timeout=15)
        return [line.strip() for line in out.stdout.split() if line.strip()]

    def job(self, job_id: str | int) -> dict[str, str]:
        """`scontrol show job -o ID` as a dict (JobState, ExitCode, NodeList, NumCPUs...); {} if unknown."""
        out = self.run(["scontrol", "show", "job", "-o", str(job_id)], timeout=15)
        return parse_keyvalues(out.stdout) if out.returncode == 0 else {}

    def steps(self, job_id: str | int) -> list[dict[str, str]]:
        """`scontrol show step -o ID` as dicts, one per running step."""
        out = self.run(["scontrol", "show", "step", "-o", str(job_id)], timeout=15)
        return [parse_keyvalues(line) for line in out.stdout.splitlines() if "StepId=" in line]

    def wait_job(
        self, job_id: str | int, states: Iterable[str] = FINAL_STATES, timeout: float = 30.0
    ) -> dict[str, str]:
        """Poll until the job is in one of `states` (default: finished); its record, or TimeoutError."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        info = self.job(job_id)
        while info.get("JobState") not in wanted:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} not in {sorted(wanted)} within {timeout}s: {info}")
            time.sleep(0.1)
            info = self.job(job_id)
        return info

    def daemon_pids(self) -> dict[str, int]:
        """Running daemons by name: munged, slurmctld, slurmd, and slurmctld's helper slurmscriptd."""
        pids = super().daemon_pids()
        pids.update((name, pid) for name, pid in self._helpers.items() if pid_alive(pid))
        return pids

    def recorded_pids(self) -> list[int]:
        """Every daemon pid this bed ever started (alive or not), to check after close()."""
        return sorted(self._every_pid | set(self._helpers.values()))

    def stepd_pids(self) -> list[int]:
        """Live slurmstepd processes of this bed (tagged through slurmd's environment)."""
        return [pid for pid in self.leftover_pids() if process_name(pid) == "slurmstepd"]

    def leftover_pids(self) -> list[int]:
        """Live processes of the bed other than its daemons: slurmstepd, tasks, their children,
        clients started with the bed's env; a tagged process or a descendant of a tagged slurmstepd."""
        daemons = set(self.daemon_pids().values())
        tagged, parents = tagged_processes(f"{TAG_VAR}={self.tag}".encode())
        roots = tagged - daemons
        stepds = {pid for pid in roots if process_name(pid) == "slurmstepd"}
        return sorted((roots | below(stepds, parents)) - daemons)

    def log(self, name: str) -> str:
        """A daemon's log (munged, slurmctld, slurmd), for a failing test's message."""
        try:
            return (self.base / "log" / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    def slurm_conf(self) -> str:
        """The slurm.conf of this bed: every path in the bed directory, ports chosen free."""
        b = self.base
        return (
            "# slurmbed: generated, do not edit\n"
            "ClusterName=slurmbed\n"
            f"SlurmctldHost={self.node}(127.0.0.1)\n"
            f"SlurmctldPort={self.ctld_port}\n"
            f"SlurmdPort={self.slurmd_port}\n"
            "SlurmUser=root\n"
            "SlurmdUser=root\n"
            "AuthType=auth/munge\n"
            "CredType=cred/munge\n"
            f"AuthInfo=socket={self.munge_socket}\n"
            f"StateSaveLocation={b / 'state'}\n"
            f"SlurmdSpoolDir={b / 'spool'}\n"
            f"SlurmctldPidFile={b / 'run' / 'slurmctld.pid'}\n"
            f"SlurmdPidFile={b / 'run' / 'slurmd.pid'}\n"
            f"SlurmctldLogFile={b / 'log' / 'slurmctld.log'}\n"
            f"SlurmdLogFile={b / 'log' / 'slurmd.log'}\n"
            f"SlurmctldDebug={self.debug}\n"
            f"SlurmdDebug={self.debug}\n"
            f"PlugStackConfig={b / 'plugstack.conf'}\n"
            "ProctrackType=proctrack/linuxproc\n"
            f"TaskPlugin={self.task_plugin}\n"
            "SelectType=select/cons_tres\n"
            f"SelectTypeParameters={self.select_parameters}\n"
            "SchedulerType=sched/builtin\n"
            "MpiDefault=none\n"
            "SwitchType=switch/none\n"
            "JobCompType=jobcomp/none\n"
            "JobAcctGatherType=jobacct_gather/none\n"
            "AccountingStorageType=accounting_storage/none\n"
            "JobContainerType=job_container/none\n"
            "SlurmdParameters=config_overrides\n"
            "ReturnToService=2\n"
            "SlurmctldTimeout=30\n"
            "SlurmdTimeout=30\n"
            "MessageTimeout=10\n"
            "InactiveLimit=0\n"
            f"KillWait={self.kill_wait}\n"
            "MinJobAge=300\n"
            f"NodeName={self.node} NodeHostname={self.node} NodeAddr=127.0.0.1 "
            f"CPUs={self.cpus} {self._topology}RealMemory={self.real_memory} State=UNKNOWN\n"
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
            f"{self.extra_conf}"
        )

    # -- internals --------------------------------------------------------------------------

    def _hardware_topology(self) -> str:
        """`Boards=.. SocketsPerBoard=.. CoresPerSocket=.. ThreadsPerCore=.. ` from `slurmd -C` when the
        node claims this machine's CPU count; without them Slurm takes every CPU for a socket."""
        try:
            out = subprocess.run(
                [_find("slurmd") or "slurmd", "-C"], capture_output=True, text=True, timeout=30, env={"PATH": SBIN_PATH}
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""
        found = parse_keyvalues(out.splitlines()[0] if out else "")
        keys = ("Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
        if found.get("CPUs") != str(self.cpus) or not all(found.get(k, "").isdigit() for k in keys):
            return ""
        return "".join(f"{k}={found[k]} " for k in keys)

    def _daemon_env(self) -> dict[str, str]:
        return {"PATH": SBIN_PATH, "SLURM_CONF": str(self.conf), TAG_VAR: self.tag, "LANG": "C"}

    def _write_munge_key(self) -> None:
        """1024 random bytes, mode 0400, root's: what munged insists on."""
        self.munge_key.unlink(missing_ok=True)
        fd = os.open(self.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        try:
            os.write(fd, os.urandom(1024))
        finally:
            os.close(fd)
        os.chown(self.munge_key, 0, 0)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start a daemon in the foreground; its stdout/stderr go to log/NAME.out."""
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
        sigterm = int(signal.SIGTERM)

        def child_setup() -> None:  # between fork and exec: no daemon outlives its starter
            prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)

        with open(self.base / "log" / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=self._daemon_env(),
                cwd=self.base,
                preexec_fn=child_setup,
                close_fds=True,
            )
        return self._record(name, proc)

    def _daemon_output(self, name: str) -> str:
        try:
            out = (self.base / "log" / f"{name}.out").read_text(errors="replace")
        except OSError:
            out = ""
        return (out + self.log(name))[-3000:]

    def _start_munged(self, timeout: float) -> None:
        """munged -F (foreground, logs to its stdout), --force: the bed dir is not world-searchable."""
        argv = [
            _find("munged") or "munged",
            "--foreground",
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={self.munge_key}",
            f"--pid-file={self.base / 'run' / 'munged.pid'}",
            f"--log-file={self.base / 'log' / 'munged.log'}",
            f"--seed-file={self.base / 'munge' / 'munged.seed'}",
            "--num-threads=4",
        ]
        proc = self._spawn("munged", argv)
        munge = _find("munge") or "munge"
        self._wait(
            "munged",
            proc,
            timeout,
            lambda: (
                self.munge_socket.exists()
                and subprocess.run([munge, "-n", "-S", str(self.munge_socket)], capture_output=True).returncode == 0
            ),
        )

    def _start_slurm(self, ctld_port: int, slurmd_port: int, timeout: float) -> None:
        """slurmctld first (until `scontrol ping` says UP), then slurmd: it registers at once."""
        self.ctld_port, self.slurmd_port = ctld_port, slurmd_port
        self.conf.write_text(self.slurm_conf())
        ctld = self._spawn("slurmctld", [_find("slurmctld") or "slurmctld", "-D", "-c", "-f", str(self.conf)])
        self._wait("slurmctld", ctld, timeout, lambda: "is UP" in self.run(["scontrol", "ping"], timeout=15).stdout)
        for entry in os.listdir("/proc"):  # slurmctld forks slurmscriptd before it answers; it ends with slurmctld
            if entry.isdigit() and parent_pid(int(entry)) == ctld.pid and process_name(int(entry)) == "slurmscriptd":
                self._helpers["slurmscriptd"] = int(entry)
        slurmd = self._spawn("slurmd", [_find("slurmd") or "slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait("slurmd", slurmd, timeout, lambda: self.node_state() == "idle")

    def _kill_stale(self) -> None:
        """Kill daemons left from an earlier bed in this directory (a run killed with -9), by pid file."""
        for name in DAEMONS:
            pidfile = self.base / "run" / f"{name}.pid"
            try:
                pid = int(pidfile.read_text().split()[0])
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    cmdline = handle.read()
            except (OSError, ValueError, IndexError):
                continue
            if str(self.base).encode() in cmdline:
                signal_quietly(pid, signal.SIGKILL)
            pidfile.unlink(missing_ok=True)


def slurmbed_fixtures(name: str = "slurmbed", settle: float = 5.0, **options: Any):  # type: ignore[no-untyped-def]
    """A test module's `slurm` (a SlurmBed started once for the module) and its autouse
    `clean_slurm` (tests/daemonbed.py's `bed_fixtures`). Use: `slurm, clean_slurm = slurmbed_fixtures()`."""
    return bed_fixtures(lambda folder: SlurmBed(folder, **options), "slurm", name, settle)


def main(argv: Sequence[str] | None = None) -> int:
    """Time a bed's start-up and shutdown, and run one srun through it."""
    status = time_by_hand(argv, SlurmBed, lambda bed: ["srun", "-n", str(bed.cpus), "hostname"], "Slurm node")
    print("slurm processes left on the machine:", system_slurm_pids())
    return status


if __name__ == "__main__":
    raise SystemExit(main())
