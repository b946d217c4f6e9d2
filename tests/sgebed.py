"""A throw-away one-node Grid Engine cell on this machine, for tests of the Grid Engine launch engine.

    with SgeBed(tmp_dir) as bed:
        bed.run(["qsub", "-pe", "mpi", "2", "-sync", "y", "-b", "y", "hostname"])

Real daemons from Debian's `gridengine-master gridengine-exec gridengine-client`, run in the
foreground (`SGE_ND`) so the pids we hold are theirs: `sge_qmaster` and `sge_execd`, each
started under a bare environment (SGE_ROOT, SGE_CELL, the cell's ports, PATH and the bed's
tag: a daemon's environment reaches every job). The cell is the bed's own: its SGE_ROOT is a
folder of the bed (the binaries linked in from /usr/lib/gridengine), its spool, the accounting
file and the daemons' ports (chosen free) are the bed's too, so nothing reads or writes
/var/lib/gridengine or /var/spool/gridengine and the machine's own cell, if it runs, is left
alone. Clients find the cell through `bed.env` (SGE_ROOT, SGE_CELL, SGE_QMASTER_PORT,
SGE_EXECD_PORT).

The cell is seeded the way Debian's init_cluster does it (spoolinit, spooldefaults) with what
a test cell needs on top: root may run jobs (min_uid 0), root and this host are manager,
admin and submit host; then, with the qmaster up, whole files go in through `qconf -A...`/`-M...`
(no editor): the execution host, a parallel environment `mpi` (control_slaves TRUE,
job_is_first_task FALSE, $fill_up), one queue `all.q` with `slots` slots and no load threshold,
and a scheduler that runs every second. Where this host's address reverses to another name
(127.0.0.1 is `localhost`), `host_aliases` names it as the same host, or the qmaster refuses
its own clients.

Finding leftovers: the daemons carry `SGEBED_TAG=<bed id>` in their environment, and every job,
its `qrsh -inherit` tasks and what they start get it from the execd, so a job's processes are
the tagged ones that are not daemons.

Needs root. Run `python -m tests.sgebed` to time a start-up by hand. Stdlib only, no pytest in
the class.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.daemonbed import DaemonBed, bed_fixtures, time_by_hand
from tests.procs import tagged_processes

TAG_VAR = "SGEBED_TAG"
LIB = Path("/usr/lib/gridengine")  # Debian's binaries: the daemons, the clients and the spool tools
SHARE = Path("/usr/share/gridengine")
DAEMONS = ("sge_qmaster", "sge_execd", "sge_shepherd")
CLIENTS = ("qsub", "qrsh", "qdel", "qstat", "qconf", "qacct", "spoolinit", "spooldefaults")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
# Inherited from a job around the test run, these would make a client act for that job or cell.
CLIENT_VARS = ("SGE_", "JOB_ID", "JOB_NAME", "PE_HOSTFILE", "PE", "NSLOTS", "NHOSTS", "NQUEUES", "ARC", "QUEUE")


def sge_available() -> tuple[bool, str]:
    """Whether an SgeBed can run here, and why not: tests skip with this reason."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if not (LIB / name).exists()]
    if missing:
        return False, (
            f"not installed: {', '.join(missing)} "
            "(Debian: apt-get install --no-install-recommends gridengine-master gridengine-exec gridengine-client)"
        )
    if os.geteuid() != 0:
        return False, "sge_execd must run as root to start jobs"
    return True, "ok"


class SgeBed(DaemonBed):
    """sge_qmaster + sge_execd for one host (this one), a PE `mpi`, a queue `all.q`, client env.

    `start()` (or `with`) writes the cell, starts the qmaster, loads the host, PE, queue and
    scheduler, starts the execd and returns once the queue instance takes jobs. `close()`
    deletes the bed's jobs, kills by pid whatever job process is left, then stops the execd and
    the qmaster by pid (SIGTERM, SIGKILL after `grace` s).

    `slots`: the queue's slots on this host (a PE job asks for up to that many).
    """

    CONTROLLER = "sge_qmaster"
    STOP_ORDER = ("sge_execd", "sge_qmaster")
    BIND_ERRORS = ("Address already in use", "can't bind socket")
    GRACE = 1.5

    def __init__(self, base: str | os.PathLike[str], slots: int = 4) -> None:
        super().__init__(base)
        self.tag = uuid.uuid4().hex
        self.slots = slots
        self.root = self.base / "root"
        self.common = self.root / "default" / "common"
        self.spool = self.base / "spool"
        self.node = ""
        self.qmaster_port = 0
        self.execd_port = 0

    # -- life cycle -------------------------------------------------------------------------

    def available(self) -> tuple[bool, str]:
        return sge_available()

    def _start(self, timeout: float) -> None:
        """The cell's files, then the qmaster (until it answers), its configuration, and the
        execd (until the queue instance takes jobs)."""
        self._on_free_ports(
            lambda qmaster, execd: self._start_cell(qmaster, execd, timeout),
            self.STOP_ORDER,
            "ports for the qmaster and the execd",
        )

    def _start_cell(self, qmaster_port: int, execd_port: int, timeout: float) -> None:
        self.qmaster_port, self.execd_port = qmaster_port, execd_port
        self.env = {
            "SGE_ROOT": str(self.root),
            "SGE_CELL": "default",
            "SGE_QMASTER_PORT": str(self.qmaster_port),
            "SGE_EXECD_PORT": str(self.execd_port),
        }
        self._write_cell()
        self._start_daemons(timeout)

    def remove_jobs(self) -> None:
        """qdel every job of the cell (all are this user's)."""
        ids = self.job_ids()
        if ids:
            self.run(["qdel", "-f", *ids], timeout=15)

    def _daemon_output(self, name: str) -> str:
        return self.messages(name)

    # -- what tests use ---------------------------------------------------------------------

    def client_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """This process's environment without any Grid Engine job's variables, plus the bed's."""
        env = {k: v for k, v in os.environ.items() if not (k.startswith("SGE_") or k in CLIENT_VARS)}
        env["PATH"] = f"{self.root / 'bin' / 'lx-amd64'}:{env.get('PATH', SYSTEM_PATH)}"
        env.update(self.env)
        env.update(extra or {})
        return env

    def job_ids(self) -> list[str]:
        """Ids of the jobs the qmaster still lists (pending, running, or being deleted)."""
        out = self.run(["qstat", "-u", "*"], timeout=15)
        return [line.split()[0] for line in out.stdout.splitlines()[2:] if line.split() and line.split()[0].isdigit()]

    def wait_job(self, job_id: str | int, timeout: float = 60.0) -> list[dict[str, str]]:
        """Wait until the job is finished and accounted; its accounting records (TimeoutError if not)."""
        deadline = time.monotonic() + timeout
        while True:
            records = self.accounting(job_id)
            if any(r["pe_taskid"] == "NONE" for r in records) and str(job_id) not in self.job_ids():
                return records
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} not finished within {timeout}s: {self.job_ids()}")
            time.sleep(0.1)

    def accounting(self, job_id: str | int) -> list[dict[str, str]]:
        """The job's records in the cell's accounting file (what qacct reads): one per parallel
        task in the order the tasks were started (`pe_taskid` `1.host`, `2.host`, ...), then the
        job's own (`NONE`), with `hostname`, `failed` and `exit_status` (`qsub -sync y` says 0 for
        a job it killed). The file's own order is not theirs: a task's record may be written
        after the next task's."""
        try:
            text = (self.common / "accounting").read_text()
        except OSError:
            return []
        records = []
        for line in text.splitlines():
            fields = line.split(":")
            if line.startswith("#") or len(fields) < 45 or fields[5] != str(job_id):
                continue
            records.append(
                {"hostname": fields[1], "failed": fields[11], "exit_status": fields[12], "pe_taskid": fields[-4]}
            )
        return sorted(records, key=_started)

    def leftover_pids(self) -> list[int]:
        """Live processes of the cell other than its daemons: shepherds, jobs, their tasks and
        everything they started (each carries the bed's tag from the execd)."""
        daemons = set(self.daemon_pids().values())
        tagged, _ = tagged_processes(f"{TAG_VAR}={self.tag}".encode())
        return sorted(tagged - daemons)

    def messages(self, name: str) -> str:
        """A daemon's messages file and what it printed, for a failing test's message."""
        texts = []
        spooled = self.spool.glob("qmaster/messages" if name == "sge_qmaster" else "execd/*/messages")
        for path in (self.base / f"{name}.out", *spooled):
            try:
                texts.append(path.read_text(errors="replace"))
            except OSError:
                pass
        return "".join(texts)[-3000:]

    # -- internals --------------------------------------------------------------------------

    def _tool(self, name: str, *args: str) -> None:
        """A spool tool (spoolinit, spooldefaults) on the cell while its qmaster is down."""
        proc = subprocess.run(
            [str(LIB / name), *args], env=self._daemon_env(), capture_output=True, text=True, timeout=30, cwd=self.base
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{name} {' '.join(args)}: {proc.returncode}\n{proc.stdout}{proc.stderr}")

    def _this_host(self) -> tuple[str, list[str]]:
        """This host as Grid Engine names it, and the other names its addresses reverse to (the
        qmaster takes a client from 127.0.0.1 for `localhost` and refuses it unless aliased)."""
        out = subprocess.run(
            [str(LIB / "gethostname"), "-name"], env={"PATH": SYSTEM_PATH}, capture_output=True, text=True, timeout=30
        )
        node = out.stdout.strip() or socket.gethostname()
        others: list[str] = []
        addresses = {"127.0.0.1"}
        try:
            addresses.add(socket.gethostbyname(node))
        except OSError:
            pass
        for address in sorted(addresses):
            try:
                name = socket.gethostbyaddr(address)[0]
            except OSError:
                continue
            if name != node and name not in others:
                others.append(name)
        return node, others

    def _write_cell(self) -> None:
        """SGE_ROOT with the binaries linked in, the cell's common files, its spool seeded."""
        if self.base.exists():
            for sub in ("root", "spool", "conf"):
                shutil.rmtree(self.base / sub, ignore_errors=True)
        self.common.mkdir(parents=True)
        for sub in ("bin", "utilbin", "lib"):
            (self.root / sub).mkdir()
            (self.root / sub / "lx-amd64").symlink_to(LIB)
        (self.root / "util").symlink_to(SHARE / "util")
        for sub in ("qmaster/job_scripts", "execd", "db"):
            (self.spool / sub).mkdir(parents=True)
        conf = self.base / "conf"
        (conf / "hosts").mkdir(parents=True)
        self.node, aliases = self._this_host()
        (self.common / "act_qmaster").write_text(f"{self.node}\n")
        (self.common / "host_aliases").write_text(f"{self.node} {' '.join(aliases)}\n" if aliases else "")
        (self.common / "bootstrap").write_text(
            "admin_user              none\n"
            "default_domain          none\n"
            "ignore_fqdn             false\n"
            "spooling_method         berkeleydb\n"
            "spooling_lib            libspoolb\n"
            f"spooling_params         {self.spool / 'db'}\n"
            "binary_path             /usr/sbin\n"
            f"qmaster_spool_dir       {self.spool / 'qmaster'}\n"
            "security_mode           none\n"
            "listener_threads        2\n"
            "worker_threads          2\n"
            "scheduler_threads       1\n"
        )
        (conf / "global").write_text(self._global_configuration())
        (conf / "hosts" / self.node).write_text(f"hostname {self.node}\n")
        self._tool("spoolinit", "berkeleydb", "libspoolb", str(self.spool / "db"), "init")
        self._tool("spooldefaults", "configuration", str(conf / "global"))
        self._tool("spooldefaults", "complexes", str(SHARE / "util" / "resources" / "centry"))
        self._tool("spooldefaults", "usersets", str(SHARE / "util" / "resources" / "usersets"))
        self._tool("spooldefaults", "managers", "root")
        self._tool("spooldefaults", "adminhosts", str(conf / "hosts"))
        self._tool("spooldefaults", "submithosts", str(conf / "hosts"))

    def _global_configuration(self) -> str:
        """Debian's default configuration with the bed's spool, root allowed, no mail, and the
        accounting file written at once (qacct is how a test reads a job's end)."""
        text = (SHARE / "default-configuration").read_text()
        values = {
            "execd_spool_dir": str(self.spool / "execd"),
            "mailer": "/bin/true",
            "min_uid": "0",
            "min_gid": "0",
            "reporting_params": "accounting=true reporting=false flush_time=00:00:01 joblog=false "
            "sharelog=00:00:00 accounting_flush_time=00:00:00",
            "load_report_time": "00:00:10",
        }
        lines = []
        for line in text.splitlines():
            key = line.split()[0] if line.split() else ""
            lines.append(f"{key} {values.pop(key)}" if key in values else line)
        return "\n".join(lines + [f"{k} {v}" for k, v in values.items()]) + "\n"

    def _queue(self) -> str:
        return (
            "qname all.q\n"
            f"hostlist {self.node}\n"
            "seq_no 0\nload_thresholds NONE\nsuspend_thresholds NONE\nnsuspend 1\nsuspend_interval 00:05:00\n"
            "priority 0\nmin_cpu_interval 00:05:00\nprocessors UNDEFINED\nqtype BATCH INTERACTIVE\n"
            "ckpt_list NONE\npe_list mpi\nrerun FALSE\n"
            f"slots {self.slots}\n"
            "tmpdir /tmp\nshell /bin/sh\nprolog NONE\nepilog NONE\nshell_start_mode posix_compliant\n"
            "starter_method NONE\nsuspend_method NONE\nresume_method NONE\nterminate_method NONE\n"
            "notify 00:00:60\nowner_list NONE\nuser_lists NONE\nxuser_lists NONE\nsubordinate_list NONE\n"
            "complex_values NONE\nprojects NONE\nxprojects NONE\ncalendar NONE\ninitial_state default\n"
            + "".join(f"{limit} INFINITY\n" for limit in _LIMITS)
        )

    def _cell_files(self) -> dict[str, str]:
        """What `qconf -A...`/`-M...` loads once the qmaster is up, in that order."""
        return {
            "-Ae": f"hostname {self.node}\nload_scaling NONE\ncomplex_values NONE\nuser_lists NONE\n"
            "xuser_lists NONE\nprojects NONE\nxprojects NONE\nusage_scaling NONE\nreport_variables NONE\n",
            "-Ap": "pe_name mpi\nslots 9999\nuser_lists NONE\nxuser_lists NONE\nstart_proc_args NONE\n"
            "stop_proc_args NONE\nallocation_rule $fill_up\ncontrol_slaves TRUE\njob_is_first_task FALSE\n"
            "urgency_slots min\naccounting_summary FALSE\nqsort_args NONE\n",
            "-Aq": self._queue(),
            "-Msconf": _SCHEDULER,
        }

    def _daemon_env(self) -> dict[str, str]:
        return {"PATH": SYSTEM_PATH, **self.env, TAG_VAR: self.tag, "LANG": "C"}

    def _spawn(self, name: str) -> subprocess.Popen[bytes]:
        """A daemon in the foreground (SGE_ND), in a session of its own; its output to NAME.out."""
        with open(self.base / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(
                [str(LIB / name)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env={**self._daemon_env(), "SGE_ND": "true"},
                cwd=self.base,
                start_new_session=True,
                close_fds=True,
            )
        return self._record(name, proc)

    def _qconf(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run([str(LIB / "qconf"), *args], timeout=30)

    def _start_daemons(self, timeout: float) -> None:
        """The qmaster (until qconf reaches it), the cell's files, then the execd (until the
        queue instance on this host is in no state: neither unknown nor in alarm)."""
        qmaster = self._spawn("sge_qmaster")
        self._wait("sge_qmaster", qmaster, timeout, lambda: self._qconf("-sh").returncode == 0)
        for option, text in self._cell_files().items():
            path = self.base / "conf" / option.strip("-")
            path.write_text(text)
            done = self._qconf(option, str(path))
            if done.returncode != 0:
                raise RuntimeError(f"qconf {option}: {done.stdout}{done.stderr}")
        execd = self._spawn("sge_execd")
        self._wait("sge_execd", execd, timeout, self._queue_ready)

    def _queue_ready(self) -> bool:
        out = self.run(["qstat", "-f", "-q", f"all.q@{self.node}"], timeout=15).stdout
        rows = [line.split() for line in out.splitlines() if line.startswith("all.q@")]
        return bool(rows) and len(rows[0]) == 5  # queuename qtype resv/used/tot load arch, no states column


_LIMITS = ("s_rt", "h_rt", "s_cpu", "h_cpu", "s_fsize", "h_fsize", "s_data", "h_data", "s_stack", "h_stack")
_LIMITS += ("s_core", "h_core", "s_rss", "h_rss", "s_vmem", "h_vmem")
# Debian's scheduler configuration with a one-second interval, flushed on every submit and end
# (a test's job starts within a second, not fifteen), and no load adjustment (a busy 2-core
# machine must not hold jobs back).
_SCHEDULER = """algorithm default
schedule_interval 0:0:1
maxujobs 0
queue_sort_method load
job_load_adjustments NONE
load_adjustment_decay_time 0:7:30
load_formula np_load_avg
schedd_job_info true
flush_submit_sec 1
flush_finish_sec 1
params none
reprioritize_interval 0:0:0
halftime 168
usage_weight_list cpu=1.000000,mem=0.000000,io=0.000000
compensation_factor 5.000000
weight_user 0.250000
weight_project 0.250000
weight_department 0.250000
weight_job 0.250000
weight_tickets_functional 0
weight_tickets_share 0
share_override_tickets TRUE
share_functional_shares TRUE
max_functional_jobs_to_schedule 200
report_pjob_tickets TRUE
max_pending_tasks_per_job 50
halflife_decay_list none
policy_hierarchy OFS
weight_ticket 0.500000
weight_waiting_time 0.278000
weight_deadline 3600000.000000
weight_urgency 0.500000
weight_priority 0.000000
max_reservation 0
default_duration INFINITY
"""


def job_id_of(qsub_output: str) -> str:
    """The id in qsub's `Your job 12 ("name") has been submitted`."""
    found = re.search(r"Your job (\d+)", qsub_output)
    if not found:
        raise ValueError(f"no job id in qsub's output: {qsub_output!r}")
    return found.group(1)


def sgebed_fixtures(name: str = "sgebed", settle: float = 10.0, **options: Any):  # type: ignore[no-untyped-def]
    """A test module's `sge` (an SgeBed started once for the module) and its autouse
    `clean_sge` (tests/daemonbed.py's `bed_fixtures`). Use: `sge, clean_sge = sgebed_fixtures()`."""
    return bed_fixtures(lambda folder: SgeBed(folder, **options), "sge", name, settle)


def main(argv: Sequence[str] | None = None) -> int:
    """Time a cell's start-up and shutdown, and run one parallel job through it."""
    return time_by_hand(
        argv,
        SgeBed,
        lambda bed: [
            "qsub",
            "-pe",
            "mpi",
            str(bed.slots),
            "-sync",
            "y",
            "-b",
            "y",
            "-j",
            "y",
            "-o",
            "/dev/null",
            "true",
        ],
        "Grid Engine cell",
    )


def _started(record: dict[str, str]) -> tuple[bool, int]:
    """A record's place: parallel tasks by their number (`2.host`), the job's own (`NONE`) last."""
    number = record["pe_taskid"].split(".", 1)[0]
    return (not number.isdigit(), int(number) if number.isdigit() else 0)


if __name__ == "__main__":
    raise SystemExit(main())
