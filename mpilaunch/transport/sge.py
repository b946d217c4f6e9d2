"""Agents started by Grid Engine (`--launcher sge`, and by default inside a parallel job), as
Open MPI (plm/rsh under SGE) and hydra (bootstrap sge) start their daemons there.

One `qrsh -inherit -nostdin -V HOST COMMAND` per host starts its agent as a task of the job
(a host of `PE_HOSTFILE`, in a PE with `control_slaves TRUE`): the task runs under the host's
execd, so the job's accounting and limits apply to it and `qdel` reaches it. The command is
parsed again by a shell on the host, as over ssh: it is stage 1 as one quoted line. qrsh keeps
no stdio of its own for us (`-nostdin`), so each agent connects back over TCP
(connect_back.py) with the per-run secret from the task's environment (`-V` exports the
launcher's) and its host's index. What qrsh says (its errors, an agent that died before it
connected) goes to a nameless file, read for the host's error line. `qdel` SIGKILLs a task's
process group and session, which the agent's ranks have left (each runs in a session of its
own): the agent's guardian, in a session of its own too, ends them (agent/reaper.py).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping

from mpilaunch.errors import LaunchError
from mpilaunch.plan.hosts import Host
from mpilaunch.transport.base import HostResult, Transport, TransportError
from mpilaunch.transport.bootstrap import agent_payload
from mpilaunch.transport.connect_back import BackLink, Carrier, accept_agents
from mpilaunch.transport.sshcommon import SshOptions
from mpilaunch.transport.stage1 import SECRET_VAR, connect_back_line

ACCEPT_TIMEOUT = 60.0  # seconds for every qrsh to start its task and each agent to connect back
OUTPUT_KEPT = 4096  # bytes of qrsh's output read for its last words
MISSING = " (before its agent connected back)"  # after `qrsh exited with status 1: its last line`


class Qrsh(Carrier):
    """One host's qrsh, its output in a file of its own with no name."""

    program = "qrsh"
    ended = "its Grid Engine task ended"
    # qrsh lingers about a second after its task ended; SIGTERM then ends it with status 0, the
    # task's accounting whole (Open MPI's mpirun does not wait for it either)
    grace = 0.2

    def __init__(self, pid: int, output: int) -> None:
        super().__init__(pid)
        self.output = output

    def exited(self) -> str:
        """`qrsh exited with status 1`, then qrsh's (or the task's) last non-empty line of output."""
        exited = super().exited()
        try:
            size = os.fstat(self.output).st_size
            data = os.pread(self.output, OUTPUT_KEPT, max(0, size - OUTPUT_KEPT))
        except OSError:
            return exited
        lines = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
        return f"{exited}: {lines[-1]}" if exited and lines else exited

    def end(self, grace: float) -> None:
        super().end(grace)
        if self.output >= 0:
            os.close(self.output)
            self.output = -1


def qrsh_program(env: Mapping[str, str]) -> str:
    """The job's own qrsh, `$SGE_ROOT/bin/$ARC/qrsh` (as Open MPI finds it), else qrsh on PATH."""
    from mpilaunch.host.programs import find_program

    root, arch = env.get("SGE_ROOT", ""), env.get("ARC") or env.get("SGE_ARCH", "")
    if root and arch and os.access(os.path.join(root, "bin", arch, "qrsh"), os.X_OK):
        return os.path.join(root, "bin", arch, "qrsh")
    try:
        return find_program("qrsh", dict(env))
    except OSError:
        raise LaunchError("--launcher sge: no `qrsh` found in $SGE_ROOT/bin/$ARC or on PATH") from None


def qrsh_command(qrsh: str, host: str, command: str) -> list[str]:
    """A task of the job on host running command (one word: the host's shell parses it again):
    no stdin of its own, the launcher's environment exported."""
    return [qrsh, "-inherit", "-nostdin", "-V", host, command]


def _output_file() -> int:
    """A file with no name for a qrsh's output, gone with its last descriptor."""
    try:
        return os.memfd_create("mpilaunch-qrsh", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return os.open(os.environ.get("TMPDIR") or "/tmp", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)


def _spawn_qrsh(argv: list[str], env: Mapping[str, str]) -> Qrsh:
    """qrsh in a session of its own (Ctrl-C reaches the launcher, which stops the job its way),
    its stdin /dev/null, its stdout and stderr the nameless file."""
    output = _output_file()
    try:
        pid = os.posix_spawn(
            argv[0],
            argv,
            env,
            setsid=True,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, output, 1),
                (os.POSIX_SPAWN_DUP2, output, 2),
            ],
        )
    except BaseException:
        os.close(output)
        raise
    return Qrsh(pid, output)


class SgeTransport(Transport):
    """A qrsh task per host, each agent connecting back."""

    name = "sge"

    def __init__(self, options: SshOptions) -> None:
        self.options = options

    def start(self, hosts: Mapping[int, Host]) -> dict[int, HostResult]:
        if not hosts:
            return {}
        env = dict(os.environ)
        qrsh = qrsh_program(env)
        python = self.options.python or sys.executable
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        carriers: dict[str, Qrsh] = {}
        results = {index: HostResult(index) for index in hosts}
        try:
            listener.bind(("", 0))
            listener.listen(len(hosts) + 8)
            address = env.get("MPILAUNCH_SGE_ADDRESS") or os.uname().nodename
            port = listener.getsockname()[1]
            secret = os.urandom(16).hex()
            task_env = {**env, SECRET_VAR: secret}
            for index in sorted(hosts):
                if hosts[index].user or hosts[index].port:
                    why = "qrsh takes no user or port: Grid Engine starts the task as the job's user"
                    results[index].error = TransportError("connect", why)
                    continue
                command = connect_back_line(address, port, python, repr(str(index)))
                argv = qrsh_command(qrsh, hosts[index].name, command)
                try:
                    carriers[str(index)] = _spawn_qrsh(argv, task_env)
                except OSError as exc:
                    results[index].error = TransportError("connect", f"cannot run {qrsh}: {exc.strerror or exc}")
            agent_payload()  # read (or built) while the tasks start, not after the agents connect
            joined = accept_agents(
                listener, carriers, secret, len(carriers), lambda done: _all_gone(carriers, done), ACCEPT_TIMEOUT
            )
        except BaseException:
            for carrier in carriers.values():
                carrier.end(0.5)
            raise
        finally:
            listener.close()  # exactly the expected agents: no other connection is taken
        payload = agent_payload()
        for token, carrier in carriers.items():
            index = int(token)
            if token not in joined:
                results[index].error = TransportError("agent", carrier.missing(ACCEPT_TIMEOUT, MISSING))
                carrier.end(0.5)
                continue
            sock, rest = joined[token]
            link = BackLink(hosts[index].name, sock, carrier)
            link.outbox += payload
            link.unread = rest  # what the agent sent behind its first line: its marker, perhaps more
            results[index].address = f"sge:{hosts[index].name}"
            results[index].link = link
        return results


def _all_gone(carriers: Mapping[str, Qrsh], joined: Mapping[str, object]) -> bool:
    """Every qrsh whose agent has not connected back has left: nobody else will."""
    return all(carrier.poll() is not None for token, carrier in carriers.items() if token not in joined)
