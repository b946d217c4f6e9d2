"""Remote hosts' agents over SSH (paramiko): one connection and one agent channel per host.

Connections are opened in parallel under a cap, with jittered retries for what sshd's
MaxStartups does to bursts (a connection dropped before the banner). Host keys are checked
against known_hosts; an unknown key is refused unless the user opts in, a changed key always.
paramiko is imported here only, so a job on one machine never pays for it.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import ModuleType

from mpilaunch.plan.hosts import Host, HostSyntaxError, check_host_name, check_user_name
from mpilaunch.protocol.record import Record
from mpilaunch.transport.base import HostResult, Transport, TransportError
from mpilaunch.transport.bootstrap import agent_command, agent_payload
from mpilaunch.transport.ssh_steps import resolved
from mpilaunch.transport.sshcommon import CONNECT_TIMEOUT, RemoteLink, SshOptions, show_agent_lines, ssh_on_path
from mpilaunch.transport.sshconfig import not_honoured

TYPE_CHECKING = False
if TYPE_CHECKING:
    import paramiko  # only for annotations: imported when paramiko is the SSH client

MAX_PARALLEL = 32  # connections being opened at once
ATTEMPTS = 5  # for connections dropped before the banner (sshd MaxStartups)
STRICT_ACCEPTING = ("no", "off", "false", "accept-new")


def import_paramiko() -> ModuleType:
    """paramiko, without `invoke`: paramiko.config would run a config's `Match exec` commands
    through it; mpilaunch lets `ssh -G` do that where ssh exists, and without it says in one
    line that it cannot (transport/sshconfig.py). paramiko logs a failed handshake with its
    traceback from its own thread: with no handler configured, logging's last resort would
    print that on stderr, and mpilaunch reports it in one line."""
    if "paramiko" not in sys.modules and "invoke" not in sys.modules:
        sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` fails at once
        try:
            import paramiko
        finally:
            if sys.modules.get("invoke", 0) is None:
                del sys.modules["invoke"]
    import logging

    import paramiko

    logger = logging.getLogger("paramiko")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return paramiko


class SshTarget(Record):
    """Where and how to reach one host, after ~/.ssh/config (or --ssh-config) is applied."""

    name: str
    hostname: str
    port: int = 22
    user: str = ""
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    proxy_jump: str | None = None
    strict: str = "ask"
    known_hosts: tuple[str, ...] = ()
    timeout: float = CONNECT_TIMEOUT

    @property
    def key_name(self) -> str:
        """The name known_hosts records this host's key under."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def load_config(path: str | None) -> Callable[[str], dict]:
    """Each host's settings as OpenSSH reads the config: `ssh -G` where ssh is on PATH, else
    paramiko's parser with Include expanded (transport/sshconfig.py)."""
    from mpilaunch.transport.sshconfig import resolver

    ssh = ssh_on_path()
    return resolver(path, ssh, None if ssh else import_paramiko())


def ssh_target(name: str, user: str | None, port: int | None, config: Callable[[str], dict]) -> SshTarget:
    """Apply the ssh config (load_config's lookup) to one host; the hostfile's user@ and port= win."""
    from mpilaunch.transport.sshconfig import ConfigError

    try:
        entry = config(name)
    except ConfigError as exc:
        raise TransportError("resolve", str(exc)) from None
    user = user or entry.get("user") or getpass.getuser()
    try:
        check_user_name(user)
    except HostSyntaxError as exc:
        raise TransportError("resolve", str(exc)) from None
    known = entry.get("userknownhostsfile", "~/.ssh/known_hosts ~/.ssh/known_hosts2").split()
    proxy = entry.get("proxyjump")
    return SshTarget(
        name=name,
        hostname=entry.get("hostname", name),
        port=port or _config_port(entry.get("port", "22"), name),
        user=user,
        identity_files=tuple(os.path.expanduser(f) for f in entry.get("identityfile", [])),
        identities_only=entry.get("identitiesonly", "no").lower() == "yes",
        proxy_jump=None if not proxy or proxy.lower() == "none" else proxy,
        strict=entry.get("stricthostkeychecking", "ask").lower(),
        known_hosts=tuple(os.path.expanduser(f) for f in known if f.lower() != "none"),
        timeout=_config_seconds(entry.get("connecttimeout", CONNECT_TIMEOUT), name),
    )


def _config_port(value: str, name: str) -> int:
    """The ssh config's Port for this host, checked: a bad one is one line, not a ValueError."""
    text = str(value).strip()
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
        raise TransportError("resolve", f"the ssh config gives host {name} Port {text[:40]!r}: not a port (1-65535)")
    return int(text)


def _config_seconds(value: object, name: str) -> float:
    text = str(value).strip()
    try:
        seconds = float(text) if text.isascii() else -1.0
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise TransportError("resolve", f"the ssh config gives host {name} ConnectTimeout {text[:40]!r}: not seconds")
    return seconds


def parse_jump(hop: str) -> tuple[str | None, str, int | None]:
    """A ProxyJump hop, [user@]host[:port]; names are checked like a hostfile's."""
    user, _, rest = hop.strip().rpartition("@")
    name, _, port = rest.partition(":")
    try:
        check_host_name(name)
        if user:
            check_user_name(user)
    except HostSyntaxError as exc:
        raise TransportError("resolve", f"ProxyJump {hop!r}: {exc}") from None
    if port and not port.isdigit():
        raise TransportError("resolve", f"ProxyJump {hop!r}: bad port")
    return user or None, name, int(port) if port else None


def fingerprint(key) -> str:
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


_parsed_known_hosts: dict[str, tuple[tuple[int, int, int], KnownHosts]] = {}  # path -> (stamp, keys)
_known_hosts_lock = threading.Lock()


class KnownHosts:
    """One known_hosts file as OpenSSH reads it: host keys, and keys marked `@revoked`.
    `@cert-authority` lines (certificates, which this client does not do) and lines that are
    not UTF-8 or not a key are skipped, as OpenSSH skips them; paramiko's own parser gives up
    on the whole file for any of them."""

    def __init__(self, path: str) -> None:
        paramiko = import_paramiko()
        from paramiko.hostkeys import HostKeyEntry

        self.keys = paramiko.HostKeys()
        self.revoked: list[tuple[list[str], object]] = []  # (host patterns, key)
        with open(path, "rb") as handle:
            raw_lines = handle.read().split(b"\n")
        kept = []
        for raw in raw_lines:
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                continue
            if not line or line.startswith("#"):
                continue
            marker = line.split(None, 1)[0] if line.startswith("@") else ""
            body = line[len(marker) :].strip()
            try:
                entry = HostKeyEntry.from_line(body)
            except Exception:  # a line paramiko cannot read is skipped, not the file
                continue
            if entry is None or marker == "@cert-authority":
                continue
            if marker == "@revoked":
                self.revoked.append((entry.hostnames, entry.key))
            elif not marker:
                kept.append(body)
        import tempfile

        with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".known_hosts") as clean:
            clean.write("\n".join(kept) + "\n")
            clean.flush()
            self.keys.load(clean.name)

    def is_revoked(self, name: str, key) -> bool:  # type: ignore[no-untyped-def]
        """The key is marked @revoked for this host name (patterns and hashed names as lookups read them)."""
        from paramiko.hostkeys import HostKeys

        for patterns, revoked in self.revoked:
            if revoked.asbytes() != key.asbytes():  # type: ignore[attr-defined]
                continue
            probe = HostKeys()
            for pattern in patterns:
                probe.add(pattern, revoked.get_name(), revoked)  # type: ignore[attr-defined]
            if probe.lookup(name) is not None or "*" in patterns:
                return True
        return False


def _known_keys(path: str) -> KnownHosts:
    """A known_hosts file, parsed once per run: every host's connection used to parse all of it."""
    try:
        info = os.stat(path)
        stamp = (info.st_mtime_ns, info.st_size, info.st_ino)  # an append in the same tick still changes the size
        with _known_hosts_lock:
            cached = _parsed_known_hosts.get(path)
            if cached is None or cached[0] != stamp:  # a key accepted by this run was appended
                cached = _parsed_known_hosts[path] = (stamp, KnownHosts(path))
    except OSError as exc:
        raise TransportError("host key", f"cannot read {path}: {exc.strerror}") from None
    return cached[1]


def _add_known_keys(into: paramiko.HostKeys, path: str, name: str) -> None:
    """The keys known_hosts has for this host name (hashed entries too): all a client checks."""
    known = _known_keys(path)
    for key_type, key in (known.keys.lookup(name) or {}).items():
        if not known.is_revoked(name, key):  # a revoked key is no known key: the policy refuses it
            into.add(name, key_type, key)


def _client_for(target: SshTarget, accept_new: bool) -> paramiko.SSHClient:
    """A paramiko client that knows the host keys of known_hosts and our policy for new ones."""
    paramiko = import_paramiko()

    client = paramiko.SSHClient()
    if os.path.isfile("/etc/ssh/ssh_known_hosts"):
        _add_known_keys(client.get_system_host_keys(), "/etc/ssh/ssh_known_hosts", target.key_name)
    for path in target.known_hosts:
        if os.path.isfile(path):
            _add_known_keys(client.get_host_keys(), path, target.key_name)
    save_to = target.known_hosts[0] if target.known_hosts else os.path.expanduser("~/.ssh/known_hosts")
    accept = accept_new or target.strict in STRICT_ACCEPTING

    class Policy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key) -> None:  # type: ignore[no-untyped-def]
            for path in ("/etc/ssh/ssh_known_hosts", *target.known_hosts):
                if os.path.isfile(path) and _known_keys(path).is_revoked(target.key_name, key):
                    raise TransportError(
                        "host key",
                        f"host key of {target.name} ({target.key_name}) is marked @revoked in {path} "
                        f"({fingerprint(key)}); refused",
                    )
            if not accept:
                raise TransportError(
                    "host key",
                    f"host key of {target.name} ({target.key_name}) is unknown ({fingerprint(key)}); "
                    f"if that is the right key, accept it with --ssh-accept-new (it is then added to {save_to})",
                )
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            with _known_hosts_lock:
                os.makedirs(os.path.dirname(save_to) or ".", mode=0o700, exist_ok=True)
                with open(save_to, "a", encoding="ascii") as handle:
                    handle.write(line)

    client.set_missing_host_key_policy(Policy())
    return client


def known_hosts_option(target: SshTarget) -> str:
    """` -f FILE` for ssh-keygen -R when the keys are not in the default file."""
    default = os.path.expanduser("~/.ssh/known_hosts")
    files = [f for f in target.known_hosts if os.path.isfile(f)]
    return "" if not files or files[0] == default else f" -f '{files[0]}'"


def connect_client(target: SshTarget, options: SshOptions, sock: paramiko.Channel | None = None) -> paramiko.SSHClient:
    """Connect and authenticate. A connection that ends quickly without completing the handshake
    (sshd's MaxStartups drops bursts: EOF or reset before or during key exchange) is retried
    with jittered back-off; refusals, timeouts, host key and authentication failures are not."""
    paramiko = import_paramiko()

    for attempt in range(ATTEMPTS):
        client = _client_for(target, options.accept_new)
        started = time.monotonic()
        try:
            try:
                client.connect(
                    target.hostname,
                    port=target.port,
                    username=target.user,
                    key_filename=list(target.identity_files) or None,
                    look_for_keys=not target.identities_only,
                    allow_agent=not target.identities_only,
                    timeout=target.timeout,
                    banner_timeout=target.timeout,
                    auth_timeout=target.timeout,
                    sock=sock,
                )
            except BaseException:  # a client that did not connect is closed, whatever the reason
                client.close()
                raise
            return client
        except paramiko.BadHostKeyException as exc:
            raise TransportError(
                "host key",
                f"host key of {target.name} ({target.key_name}) has CHANGED: it offers {fingerprint(exc.key)}, "
                f"known_hosts has {fingerprint(exc.expected_key)}; refused. If the change is expected, remove the "
                f"old key with: ssh-keygen -R '{target.key_name}'{known_hosts_option(target)}",
            ) from None
        except paramiko.AuthenticationException as exc:
            raise TransportError("auth", f"authentication as {target.user} failed: {exc}") from None
        except socket.gaierror:
            raise TransportError("resolve", f"cannot resolve {target.hostname!r}") from None
        except (paramiko.ssh_exception.NoValidConnectionsError, ConnectionRefusedError):
            raise TransportError("connect", f"connection refused by {target.hostname}:{target.port}") from None
        except (socket.timeout, TimeoutError):
            where = f"{target.hostname}:{target.port}"
            raise TransportError("connect", f"no answer from {where} in {target.timeout:g} s") from None
        except (paramiko.SSHException, EOFError, ConnectionResetError, OSError) as exc:
            waited = time.monotonic() - started
            if waited >= target.timeout * 0.8:  # it accepted TCP but never spoke SSH
                raise TransportError(
                    "connect",
                    f"{target.hostname}:{target.port} accepted a connection but gave no SSH answer "
                    f"in {target.timeout:g} s",
                ) from None
            if attempt + 1 == ATTEMPTS or sock is not None:
                why = f"{target.hostname}:{target.port}: {exc or type(exc).__name__}"
                raise TransportError("connect", why) from None
            time.sleep(min(1.0, 0.05 * 2**attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def open_connection(
    target: SshTarget, options: SshOptions, config: Callable[[str], dict]
) -> tuple[paramiko.SSHClient, list[paramiko.SSHClient]]:
    """The client for target, through its ProxyJump hops if any: (client, [jump clients])."""
    jumps: list = []
    sock = None
    try:
        if target.proxy_jump:
            hops = [parse_jump(h) for h in target.proxy_jump.split(",")]
            for i, (user, name, port) in enumerate(hops):
                hop = ssh_target(name, user, port, config)
                jump = connect_client(hop, options, sock)
                jumps.append(jump)
                following = hops[i + 1] if i + 1 < len(hops) else None
                dest = (following[1], following[2] or 22) if following else (target.hostname, target.port)
                try:
                    sock = jump.get_transport().open_channel("direct-tcpip", dest, ("127.0.0.1", 0))
                except Exception as exc:
                    why = f"jump host {name} cannot reach {dest[0]}:{dest[1]}: {exc}"
                    raise TransportError("connect", why) from None
        return connect_client(target, options, sock), jumps
    except BaseException:
        for jump in jumps:
            jump.close()
        raise


class SshLink(RemoteLink):
    """A connected agent on a remote host, over a paramiko channel."""

    patience = CONNECT_TIMEOUT * 2

    def __init__(self, name: str, client: object, chan: object, jumps: list | None = None) -> None:
        super().__init__(name)
        self.client = client
        self.chan = chan
        self.jumps = jumps if jumps is not None else []
        self._err = bytearray()
        self._said = bytearray()  # stderr before the greeting: the host's error line takes it

    def fileno(self) -> int:
        return self.chan.fileno()  # type: ignore[attr-defined]

    def recv(self) -> bytes | None:
        """Data, None when there is nothing yet, b'' at end (the agent or the connection is gone)."""
        if self.unread:
            data, self.unread = self.unread, b""
            return data
        self.read_diagnostics()
        chan = self.chan
        if chan.recv_ready():  # type: ignore[attr-defined]
            return chan.recv(1 << 18)  # type: ignore[attr-defined]
        if chan.closed or chan.eof_received:  # type: ignore[attr-defined]
            self._stderr(b"\n")
            return b""
        return None

    def _stderr(self, data: bytes) -> None:
        if self.hello is None:
            self._said += data
        else:
            show_agent_lines(self.name, self._err, data)

    def read_diagnostics(self) -> None:
        chan = self.chan
        while chan.recv_stderr_ready():  # type: ignore[attr-defined]
            self._stderr(chan.recv_stderr(1 << 16))  # type: ignore[attr-defined]

    def last_words(self) -> str:
        """The agent's (or the remote shell's) last line on stderr, else its exit status."""
        self.read_diagnostics()
        last = bytes(self._said).decode(errors="replace").strip().splitlines()
        chan = self.chan
        if not last and not chan.exit_status_ready():  # type: ignore[attr-defined]
            return ""
        status = chan.recv_exit_status() if chan.exit_status_ready() else None  # type: ignore[attr-defined]
        return f"the agent did not start: {last[-1] if last else f'it exited with status {status}'}"

    def readable(self) -> bool:
        """What start-up left unread, or data, diagnostics or the end waiting on the channel."""
        chan = self.chan
        ready = chan.recv_ready() or chan.recv_stderr_ready()  # type: ignore[attr-defined]
        return bool(self.unread) or ready or chan.closed or chan.eof_received  # type: ignore[attr-defined]

    def send(self, frame: bytes) -> None:
        with self._lock:
            self.chan.sendall(frame)  # type: ignore[attr-defined]

    def close(self) -> None:
        self._stop.set()
        for thing in (self.chan, self.client, *self.jumps):
            try:
                thing.close()  # type: ignore[attr-defined]
            except Exception:
                pass


def address_of(target: SshTarget, reached: str) -> str:
    """user@address:port, as `mpilaunch check` shows it for either client: the address the
    connection reached (or the HostName resolved here), else the HostName."""
    return f"{target.user}@{reached or target.hostname}:{target.port}"


def start_agent(target: SshTarget, options: SshOptions, config) -> SshLink:  # type: ignore[no-untyped-def]
    """Connect, start the agent and ship its code; the launcher greets it."""
    client, jumps = open_connection(target, options, config)
    link = SshLink(target.name, client, None, jumps)
    try:
        transport = client.get_transport()  # type: ignore[attr-defined]
        sock = transport.sock
        if isinstance(sock, socket.socket):
            link.peer = sock.getpeername()[0]
            link.local_address = sock.getsockname()[0]
        else:  # through a jump host: the name is all we have
            link.peer = target.hostname
        try:
            chan = transport.open_session(timeout=target.timeout)
            link.chan = chan
            chan.exec_command(agent_command(options.python))
            chan.sendall(agent_payload())
        except (socket.timeout, TimeoutError):
            raise TransportError("agent", f"the agent did not answer within {target.timeout:g} s") from None
        except Exception as exc:
            raise TransportError("agent", f"cannot start the agent: {exc}") from None
        return link
    except BaseException:
        link.close()
        raise


class ParamikoTransport(Transport):
    """One paramiko connection per host, opened in parallel under a cap, from threads."""

    name = "paramiko"
    start_blocks = True  # each start connects its hosts in threads and waits for them

    def __init__(self, options: SshOptions) -> None:
        self.options = options

    def start(self, hosts: Mapping[int, Host]) -> dict[int, HostResult]:
        """Start one agent on each host, its code shipped, in threads."""
        if not hosts:
            return {}
        config = load_config(self.options.config)

        def one(index: int) -> HostResult:
            result = HostResult(index)
            host = hosts[index]
            target = None
            try:
                target = ssh_target(host.name, host.user, host.port, config)
                for directive in not_honoured(config(host.name)):
                    ignored.setdefault(directive, []).append(host.name)
                result.link = start_agent(target, self.options, config)
                result.address = address_of(target, result.link.peer)
            except TransportError as exc:
                result.error = exc
            except Exception as exc:  # anything paramiko raises that is not classified above
                result.error = TransportError("connect", f"{type(exc).__name__}: {exc}")
            if target is not None and result.error is not None:
                result.address = address_of(target, "" if target.proxy_jump else resolved(target.hostname, target.port))
            return result

        ignored: dict[str, list[str]] = {}  # directive -> the hosts whose settings have it
        agent_payload()  # built once here: the threads below would each build it on a cold cache
        # Daemon threads, not a pool: on Ctrl-C the launcher leaves at once instead of waiting for
        # connections to hung hosts to time out; the links opened so far are closed.
        results: dict[int, HostResult] = {}
        cap = threading.Semaphore(MAX_PARALLEL)

        def run(index: int) -> None:
            with cap:
                results[index] = one(index)

        threads = [
            threading.Thread(target=run, args=(i,), name=f"ssh {hosts[i].name}", daemon=True) for i in sorted(hosts)
        ]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except BaseException:
            for result in list(results.values()):
                if result.link is not None:
                    result.link.close()
            raise
        if ignored:
            said = "; ".join(f"{d} ({', '.join(sorted(names)[:3])}{', ...' if len(names) > 3 else ''})"
                             for d, names in sorted(ignored.items()))  # fmt: skip
            print(f"mpilaunch: --ssh-client paramiko does not honour, from the ssh config: {said}; "
                  "--ssh-client openssh does", file=sys.stderr, flush=True)  # fmt: skip
        return dict(sorted(results.items()))
