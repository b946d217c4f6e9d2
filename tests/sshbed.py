"""A throw-away cluster of real OpenSSH servers on loopback aliases, for tests and benchmarks.

Each "host" nodeK is its own `sshd -D` listening on 127.0.0.(K+1) (past node250: 127.0.1.2 on),
so a test can stop one host's sshd while the others keep serving, and every connection goes
through the real OpenSSH server (privilege separation, key checks, session set-up) the way it does on a cluster.

    with SshBed(tmp_dir, hosts=4) as bed:
        subprocess.run(["ssh", "-F", str(bed.config), "node1", "true"], check=True)

Nothing here touches the machine's own sshd, /etc/ssh or ~/.ssh: keys, configs, known_hosts,
pid files and logs all live in the bed directory, and so does the sessions' HOME (their shell
reads no ~/.bashrc of the user's, their programs no ~/.cache). The only shared path is /run/sshd, the
privilege-separation directory sshd insists on (created if missing).

Finding leftovers: every listening sshd is made a child subreaper, so a process a session leaves
behind (`sleep 30 &`) is re-parented to its host's sshd instead of to PID 1, and stays visible as
a descendant. Every sshd and every session also carries `SSHBED_TAG=<bed id>` in its environment
(sshd's `SetEnv`), which still finds a leftover after its host's sshd was stopped.

Run `python -m tests.sshbed --hosts 32` to time a start-up by hand. Stdlib only, no pytest.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from tests.procs import Leftovers, below, kill_and_wait, signal_quietly, tagged_processes

TAG_VAR = "SSHBED_TAG"
PRIVSEP_DIR = Path("/run/sshd")
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
MAX_HOSTS = 1000  # hosts a bed can have (the benchmarks start 256)
_BIND_ERRORS = ("Cannot bind any address", "Bind to port", "Address already in use")


def _find(tool: str) -> str | None:
    """Absolute path of an OpenSSH tool; sshd lives in /usr/sbin, often not on a user's PATH."""
    found = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin")
    return os.path.abspath(found) if found else None


def _openssh_version(sshd: str) -> tuple[int, int]:
    """(major, minor) of sshd, to add options only newer servers know (0, 0 if unknown)."""
    try:
        out = subprocess.run([sshd, "-V"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return (0, 0)
    match = re.search(r"OpenSSH_(\d+)\.(\d+)", out.stdout + out.stderr)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _can_bind(address: str, port: int) -> bool:
    """Whether address:port is free now; SO_REUSEADDR like sshd, so TIME_WAIT does not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def bed_available() -> tuple[bool, str]:
    """Whether an SshBed can run here, and why not: tests skip with this reason."""
    for tool in ("sshd", "ssh-keygen", "ssh"):
        if _find(tool) is None:
            return False, f"{tool} not found (Debian: apt-get install openssh-server openssh-client)"
    if os.geteuid() == 0:  # root sshd chroots its pre-auth child into /run/sshd as this user
        try:
            pwd.getpwnam("sshd")
        except KeyError:
            return False, "the sshd privilege-separation user does not exist"
    if not any(_can_bind("127.0.0.2", port) for port in (0, *random.sample(range(20000, 32000), 3))):
        return False, "cannot bind the loopback alias 127.0.0.2"
    return True, "ok"


def loopback_address(index: int) -> str:
    """nodeK's address: 127.0.0.(K+1) up to node250, then 250 hosts on each next /24 from .2 on."""
    if index <= 250:
        return f"127.0.0.{index + 1}"
    block, offset = divmod(index - 251, 250)
    return f"127.0.{block + 1}.{offset + 2}"


class _Host:
    """One host's files and its running sshd."""

    def __init__(self, name: str, index: int, directory: Path) -> None:
        self.name = name
        self.address = loopback_address(index)
        self.dir = directory
        self.key = directory / "ssh_host_ed25519_key"
        self.config = directory / "sshd_config"
        self.pidfile = directory / "sshd.pid"
        self.log = directory / "sshd.log"
        self.proc: subprocess.Popen[bytes] | None = None


class SshBed(Leftovers):
    """N real sshd servers, node1..nodeN on 127.0.0.2..(N+1), one shared port, and client files.

    `start()` (or `with`) generates keys, writes configs, starts every sshd in parallel and
    returns once each one has sent its SSH banner. `close()` stops them all and kills, by pid,
    whatever processes a session left behind.

    `port`: a fixed port instead of a free one in 20000..32000. `setenv`: extra variables every
    session gets (sshd `SetEnv`). HOME is the bed's `home` folder unless setenv gives another:
    the remote shell reads no ~/.bashrc of the user's (bash reads it for ssh commands; here it
    runs `pyenv init`, ~0.15 s a connection) and the sessions' programs keep nothing in the
    user's ~/.cache.
    Each sshd gets SIGTERM when the thread that started it exits: start and restart hosts from
    a thread that lives as long as the bed (the main thread in pytest and in the benchmarks).
    """

    POLL = 0.02  # seconds between looks for leftovers (Leftovers.wait_clean)

    def __init__(
        self,
        base: str | os.PathLike[str],
        hosts: int = 4,
        port: int | None = None,
        setenv: dict[str, str] | None = None,
    ) -> None:
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be in 1..{MAX_HOSTS} (127.0.0.2 .. {loopback_address(MAX_HOSTS)})")
        self.base = Path(base).resolve()
        self.tag = uuid.uuid4().hex
        self.names = [f"node{k}" for k in range(1, hosts + 1)]
        self.config = self.base / "ssh_config"
        self.known_hosts = self.base / "known_hosts"
        self.identity = self.base / "id_ed25519"
        self.authorized_keys = self.base / "authorized_keys"
        self.port = port or 0
        self.user = pwd.getpwuid(os.geteuid()).pw_name
        self.setenv = {"HOME": str(self.base / "home"), **(setenv or {})}
        self._fixed_port = bool(port)
        self._hosts = {name: _Host(name, k, self.base / "hosts" / name) for k, name in enumerate(self.names, 1)}
        self._sshd = _find("sshd") or "/usr/sbin/sshd"
        self._keygen = _find("ssh-keygen") or "ssh-keygen"
        self._lock = threading.Lock()
        self._started = False

    # -- life cycle -------------------------------------------------------------------------

    def __enter__(self) -> SshBed:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def start(self, timeout: float = 30.0) -> SshBed:
        """Create keys and files, start every sshd, wait until all answer; retry on a port clash."""
        ok, reason = bed_available()
        if not ok:
            raise RuntimeError(f"SshBed cannot run here: {reason}")
        for host in self._hosts.values():
            host.dir.mkdir(parents=True, exist_ok=True)
        Path(self.setenv["HOME"]).mkdir(parents=True, exist_ok=True)
        self._kill_stale()
        if os.geteuid() == 0 and not PRIVSEP_DIR.is_dir():
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        self._keygen_all([self.identity, *(h.key for h in self._hosts.values())])
        self.authorized_keys.write_text(self._pub(self.identity))
        extra = "PerSourcePenalties no\n" if _openssh_version(self._sshd) >= (9, 8) else ""
        self._started = True
        for attempt in range(8):
            if not self._fixed_port:
                self.port = self._free_port()
            for host in self._hosts.values():
                host.config.write_text(self._sshd_config(host, extra))
            try:
                self._start_hosts(list(self._hosts.values()), timeout)
                break
            except _PortClash:
                self._stop_hosts(list(self._hosts.values()))
                if self._fixed_port or attempt == 7:
                    self.close()
                    raise RuntimeError(f"port {self.port} is taken on a loopback alias") from None
            except BaseException:
                self.close()
                raise
        self.write_known_hosts(self.known_hosts)
        self.write_ssh_config(self.known_hosts, self.config)
        self.wait_clean(5.0)  # the readiness probes' per-connection sshd processes
        return self

    def close(self) -> None:
        """Stop every sshd (SIGTERM, then SIGKILL) and kill, by pid, what sessions left behind."""
        if not self._started:
            return
        left = self.leftover_pids()
        self._stop_hosts(list(self._hosts.values()))
        kill_and_wait(sorted(set(left) | set(self.leftover_pids())))
        self._started = False

    def stop_host(self, name: str, timeout: float = 5.0) -> None:
        """Stop one host's sshd so new connections to it are refused; its sessions keep running."""
        self._stop_hosts([self._host(name)], timeout)

    def start_host(self, name: str, timeout: float = 30.0) -> None:
        """Start a stopped host's sshd again, on the same address, port and host key."""
        host = self._host(name)
        if host.proc is not None and host.proc.poll() is None:
            return
        self._start_hosts([host], timeout)
        self.wait_clean(5.0)

    def is_running(self, name: str) -> bool:
        proc = self._host(name).proc
        return proc is not None and proc.poll() is None

    # -- what tests look at -----------------------------------------------------------------

    def address(self, name: str) -> str:
        """The loopback address nodeK listens on (`loopback_address`)."""
        return self._host(name).address

    def host_key(self, name: str) -> str:
        """The host's public key, `ssh-ed25519 AAAA...`."""
        return self._pub(self._host(name).key)

    def known_hosts_line(self, name: str, key: str | None = None) -> str:
        """The known_hosts entry for a host, under its address and its node name."""
        host = self._host(name)
        names = ",".join(self._pattern(n) for n in (host.address, host.name))
        return f"{names} {key or self.host_key(name)}\n"

    def daemon_pids(self) -> list[int]:
        """Pids of the running listening sshd daemons."""
        return [h.proc.pid for h in self._hosts.values() if h.proc is not None and h.proc.poll() is None]

    def log(self, name: str) -> str:
        """One host's sshd log (LogLevel ERROR), for a failing test's message."""
        try:
            return self._host(name).log.read_text(errors="replace")
        except OSError:
            return ""

    def ssh_argv(self, name: str, *command: str, config: Path | None = None) -> list[str]:
        """An OpenSSH client command line for a host of this bed."""
        return ["ssh", "-F", str(config or self.config), name, *command]

    def leftover_pids(self) -> list[int]:
        """Live processes of the bed's hosts other than the listening sshd daemons themselves.

        That is, every descendant of a listening sshd (sessions, per-connection sshd, orphans
        re-parented to it as subreaper) plus every process carrying the bed's tag, which
        catches sessions of a host whose sshd was stopped.
        """
        daemons = set(self.daemon_pids())
        tagged, parents = tagged_processes(f"{TAG_VAR}={self.tag}".encode())
        return sorted((tagged | below(daemons, parents)) - daemons)

    # -- alternate client files -------------------------------------------------------------

    def write_known_hosts(self, path: Path, *, without: Iterable[str] = (), wrong: Iterable[str] = ()) -> Path:
        """Write a known_hosts file: correct for every host, except hosts left out or given a wrong key."""
        without, wrong = set(without), set(wrong)
        unknown = (without | wrong) - set(self.names)
        if unknown:
            raise KeyError(f"not hosts of this bed: {sorted(unknown)}")
        impostor = self._impostor_key() if wrong else None
        lines = [self.known_hosts_line(n, impostor if n in wrong else None) for n in self.names if n not in without]
        path = Path(path)
        path.write_text("".join(lines))
        return path

    def known_hosts_without(self, name: str) -> Path:
        """A known_hosts file that lacks this host (an unknown host for the client)."""
        return self.write_known_hosts(self.base / f"known_hosts.without-{name}", without=[name])

    def known_hosts_wrong_key(self, name: str) -> Path:
        """A known_hosts file in which this host has another key (a changed host key)."""
        return self.write_known_hosts(self.base / f"known_hosts.wrong-{name}", wrong=[name])

    def write_ssh_config(self, known_hosts: Path, path: Path | None = None) -> Path:
        """Write an ssh_config for node1..nodeN that trusts only the given known_hosts file."""
        if path is None:
            path = self.base / f"ssh_config.{Path(known_hosts).name}"
        blocks = [f"Host {h.name}\n    HostName {h.address}\n" for h in self._hosts.values()]
        common = (
            "Host *\n"
            f"    Port {self.port}\n"
            f"    User {self.user}\n"
            f'    IdentityFile "{self.identity}"\n'
            "    IdentitiesOnly yes\n"
            "    IdentityAgent none\n"
            f'    UserKnownHostsFile "{Path(known_hosts).resolve()}"\n'
            "    GlobalKnownHostsFile /dev/null\n"
            "    StrictHostKeyChecking yes\n"
            "    UpdateHostKeys no\n"
            "    CheckHostIP no\n"
            "    BatchMode yes\n"
            "    PreferredAuthentications publickey\n"
            "    ControlMaster no\n"
            "    ConnectTimeout 10\n"
            "    LogLevel ERROR\n"
        )
        path = Path(path)
        path.write_text("".join(blocks) + common)
        return path

    # -- internals --------------------------------------------------------------------------

    def _host(self, name: str) -> _Host:
        try:
            return self._hosts[name]
        except KeyError:
            raise KeyError(f"{name!r} is not a host of this bed ({self.names[0]}..{self.names[-1]})") from None

    def _pattern(self, host: str) -> str:
        return host if self.port == 22 else f"[{host}]:{self.port}"

    @staticmethod
    def _pub(key: Path) -> str:
        parts = key.with_name(key.name + ".pub").read_text().split()
        return f"{parts[0]} {parts[1]}"

    def _keygen_all(self, keys: Sequence[Path]) -> None:
        """Generate missing ed25519 keys, all at once (32 hosts: one round trip, not 33)."""
        procs = []
        for key in keys:
            if key.exists() and key.with_name(key.name + ".pub").exists():
                continue  # a reused bed directory keeps its keys
            key.unlink(missing_ok=True)
            argv = [self._keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"sshbed-{key.parent.name}", "-f", str(key)]
            procs.append(
                (
                    key,
                    subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
                )
            )
        for key, proc in procs:
            out, _ = proc.communicate(timeout=60)
            if proc.returncode != 0:
                raise RuntimeError(f"ssh-keygen failed for {key}: {out.decode(errors='replace')}")

    def _impostor_key(self) -> str:
        """A key no host has, for a known_hosts entry that must not match."""
        key = self.base / "impostor_ed25519"
        self._keygen_all([key])
        return self._pub(key)

    def _free_port(self) -> int:
        """A port below the ephemeral range that is free on every host's address."""
        addresses = [h.address for h in self._hosts.values()]
        for _ in range(200):
            port = random.randint(20000, 32000)
            if all(_can_bind(address, port) for address in addresses):
                return port
        raise RuntimeError("no port in 20000..32000 is free on all loopback aliases")

    def _sshd_config(self, host: _Host, extra: str) -> str:
        setenv = " ".join(f'"{k}={v}"' for k, v in {TAG_VAR: self.tag, **self.setenv}.items())
        return (
            f"# sshbed {host.name}: generated, do not edit\n"
            f"ListenAddress {host.address}:{self.port}\n"
            f'HostKey "{host.key}"\n'
            f'PidFile "{host.pidfile}"\n'
            f'AuthorizedKeysFile "{self.authorized_keys}"\n'
            "PermitRootLogin yes\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "UseDNS no\n"
            "PrintMotd no\n"
            "PrintLastLog no\n"
            "X11Forwarding no\n"
            "MaxStartups 100:30:200\n"
            "MaxSessions 100\n"
            "LogLevel ERROR\n"
            "Subsystem sftp internal-sftp\n"
            f"SetEnv {setenv}\n"
            f"{extra}"
        )

    def _start_hosts(self, hosts: list[_Host], timeout: float) -> None:
        """Start the hosts' sshd processes at once, then wait for each one's banner."""
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child
        sigterm = int(signal.SIGTERM)

        def child_setup() -> None:  # in the child between fork and exec; both survive the exec of sshd
            prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of sessions stay our descendants
            prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)  # no sshd outlives the process that started it

        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), TAG_VAR: self.tag}
        with self._lock:
            for host in hosts:
                host.log.write_bytes(b"")
                with open(host.log, "ab") as log:
                    argv = [self._sshd, "-D", "-e", "-f", str(host.config), "-E", str(host.log)]
                    host.proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                        env=env,
                        preexec_fn=child_setup,
                        close_fds=True,
                    )
        with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
            errors = [e for e in pool.map(lambda h: self._await_banner(h, timeout), hosts) if e]
        if errors:
            if any(any(text in e for text in _BIND_ERRORS) for e in errors):
                raise _PortClash(errors[0])
            raise RuntimeError("sshd did not start:\n" + "\n".join(errors))

    def _await_banner(self, host: _Host, timeout: float) -> str | None:
        """Connect until sshd sends its SSH banner; answer it so sshd logs no error. None when ready."""
        deadline = time.monotonic() + timeout
        assert host.proc is not None
        while time.monotonic() < deadline:
            if host.proc.poll() is not None:
                return f"{host.name}: sshd exited with {host.proc.returncode}: {self.log(host.name).strip()}"
            try:
                with socket.create_connection((host.address, self.port), timeout=2) as sock:
                    banner = sock.recv(256)
                    if banner.startswith(b"SSH-2.0-"):
                        sock.sendall(b"SSH-2.0-sshbed_probe\r\n")
                        sock.shutdown(socket.SHUT_WR)
                        with contextlib.suppress(OSError):
                            while sock.recv(65536):
                                pass
                        return None
            except OSError:
                pass
            time.sleep(0.01)
        return f"{host.name}: no SSH banner on {host.address}:{self.port} within {timeout}s: {self.log(host.name)}"

    def _stop_hosts(self, hosts: list[_Host], timeout: float = 5.0) -> None:
        """SIGTERM the hosts' sshd by pid, SIGKILL what is still there at the deadline, reap all."""
        procs = [h.proc for h in hosts if h.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                signal_quietly(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_quietly(proc.pid, signal.SIGKILL)
                proc.wait()
        for host in hosts:
            host.proc = None
            host.pidfile.unlink(missing_ok=True)

    def _kill_stale(self) -> None:
        """Kill sshd left running from an earlier bed in this directory (a test run killed with -9)."""
        for host in self._hosts.values():
            try:
                pid = int(host.pidfile.read_text().split()[0])
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    cmdline = handle.read().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            if str(host.config).encode() in cmdline:
                signal_quietly(pid, signal.SIGKILL)
            host.pidfile.unlink(missing_ok=True)


class _PortClash(RuntimeError):
    """An sshd could not bind: someone took the port between our check and its bind."""


def main(argv: Sequence[str] | None = None) -> int:
    """Time a bed's start-up and shutdown, and prove one ssh round trip per host works."""
    import tempfile

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--dir", help="bed directory (kept); default: a temporary one")
    args = parser.parse_args(argv)
    ok, reason = bed_available()
    if not ok:
        print(f"unavailable: {reason}")
        return 2
    with tempfile.TemporaryDirectory(prefix="sshbed-") as tmp:
        start = time.perf_counter()
        bed = SshBed(args.dir or tmp, hosts=args.hosts).start()
        started = time.perf_counter() - start
        try:
            procs = [subprocess.Popen(bed.ssh_argv(n, "true")) for n in bed.names]
            failed = [n for n, p in zip(bed.names, procs) if p.wait() != 0]
        finally:
            start = time.perf_counter()
            bed.close()
            closed = time.perf_counter() - start
    print(f"{args.hosts} hosts on port {bed.port}: start {started:.3f}s, close {closed:.3f}s, ssh failed on {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
