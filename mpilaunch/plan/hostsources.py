"""Hosts from the environment, for a command line that names none (no -H, no --hostfile).

A platform or batch system that allocated the machines says which ones in variables; reading
them lets `mpilaunch python train.py` inside an allocation run where the allocation is, as
mpirun does. Pure functions of the variables (and of the files they name). Every bad value is
one LaunchError naming the variable (status 2), never a silent fallback to localhost.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

from mpilaunch.errors import LaunchError
from mpilaunch.plan import hosts as hostlib
from mpilaunch.plan.hosts import Host, HostSyntaxError, shown
from mpilaunch.plan.textfiles import read_text

MAX_HOSTS = 65536  # an expression such as node[0-999999999] is a mistake, not a cluster
MAX_COUNT = 1_000_000  # as for slots in a hostfile
_RANGE_RE = r"^([0-9]{1,12})(?:-([0-9]{1,12}))?$"  # ASCII digits only, never a huge int
_TASKS_RE = r"^([0-9]{1,12})(?:\(x([0-9]{1,12})\))?$"  # both compiled by re when a Slurm list is read


def _is_count(text: str) -> bool:
    """A whole number from 1 to MAX_COUNT in ASCII digits (int() would also take '١' or 10**5000)."""
    return text.isascii() and text.isdigit() and len(text) <= 12 and 1 <= int(text) <= MAX_COUNT


def _bad(var: str, value: str, problem: str) -> LaunchError:
    return LaunchError(f"{var}={shown(value)}: {problem}")


def _host_name(name: str, where: str) -> str:
    """name, if it is a valid host name; else a LaunchError that starts with where."""
    try:
        return hostlib.check_host_name(name)
    except HostSyntaxError as exc:
        raise LaunchError(f"{where}: {exc}") from None


def _split_top(text: str, var: str) -> list[str]:
    """Split at commas outside brackets; brackets must pair up and not nest."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            if depth:
                raise _bad(var, text, "nested '['")
            depth = 1
        elif char == "]":
            if not depth:
                raise _bad(var, text, "']' without '['")
            depth = 0
        elif char == "," and not depth:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise _bad(var, text, "unclosed '['")
    items.append(text[start:])
    return items


def _expand_group(body: str, var: str, value: str) -> list[str]:
    """The inside of one bracket group: `01-04,07` -> 01 02 03 04 07 (width of the lower bound)."""
    if not body:
        raise _bad(var, value, "empty '[]'")
    out: list[str] = []
    for piece in body.split(","):
        match = re.match(_RANGE_RE, piece)
        if not match:
            raise _bad(var, value, f"expected a number or a range such as 01-04 in brackets, not {shown(piece)}")
        low_text, high_text = match.group(1), match.group(2)
        low = int(low_text)
        high = low if high_text is None else int(high_text)
        if high < low:
            raise _bad(var, value, f"range {shown(piece)} goes down")
        if len(out) + high - low + 1 > MAX_HOSTS:
            raise _bad(var, value, f"more than {MAX_HOSTS} hosts")
        width = len(low_text)  # Slurm pads to the width of the lower bound: 08-10 is 08 09 10
        out.extend(f"{n:0{width}d}" for n in range(low, high + 1))
    return out


def expand_hostlist(value: str, var: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Slurm's hostlist expression -> host names, in order.

    `node[01-04,07],gpu[1-2]` lists seven hosts; several groups in one name multiply, the
    first group varying slowest (`rack[1-2]-n[01-02]`: rack1-n01, rack1-n02, rack2-n01, ...).
    """
    text = value.strip()
    if not text:
        raise _bad(var, value, "no hosts")
    names: list[str] = []
    where = f"{var}={shown(value)}"  # what a bad name's error starts with
    for item in _split_top(text, var):
        if not item:
            raise _bad(var, value, "empty host name")
        parts: list[list[str]] = []  # literal text and groups, alternating
        rest = item
        while "[" in rest:
            before, _, after = rest.partition("[")
            body, _, rest = after.partition("]")
            parts.append([before])
            parts.append(_expand_group(body, var, value))
        parts.append([rest])
        total = 1
        for choices in parts:
            total *= len(choices)
        if len(names) + total > MAX_HOSTS:
            raise _bad(var, value, f"more than {MAX_HOSTS} hosts")
        names.extend(_host_name("".join(combo), where) for combo in itertools.product(*parts))
    return names


def expand_tasks_per_node(value: str, var: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Slurm's counts per node: `2(x3),1` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    text = value.strip()
    if not text:
        raise _bad(var, value, "no counts")
    for item in text.split(","):
        match = re.match(_TASKS_RE, item.strip())
        if not match:
            raise _bad(var, value, f"expected N or N(xM), not {shown(item)}")
        count, times = int(match.group(1)), int(match.group(2) or 1)
        if not 1 <= count <= MAX_COUNT:
            raise _bad(var, value, f"count {count} is out of range (1 to {MAX_COUNT})")
        if times < 1 or len(counts) + times > MAX_HOSTS:
            raise _bad(var, value, f"repeat count {times} is out of range (1 to {MAX_HOSTS} nodes)")
        counts.extend([count] * times)
    return counts


def slurm_hosts(env: Mapping[str, str]) -> list[Host]:
    """The allocation of a Slurm job: SLURM_JOB_NODELIST with SLURM_TASKS_PER_NODE (else
    SLURM_JOB_CPUS_PER_NODE; else one slot a node)."""
    node_var = "SLURM_JOB_NODELIST" if env.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    names = expand_hostlist(env.get(node_var, ""), node_var)
    for count_var in ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"):
        if env.get(count_var):
            counts = expand_tasks_per_node(env[count_var], count_var)
            if len(counts) != len(names):
                raise _bad(count_var, env[count_var], f"{len(counts)} counts for the {len(names)} nodes of {node_var}")
            break
    else:
        counts = [1] * len(names)
    return hostlib.merge_hosts([Host(name, count) for name, count in zip(names, counts)])


def parse_mlp_hosts(value: str, var: str = "MLP_MPI_HOSTS") -> list[Host]:
    """`worker0:2,worker1:2` (-H's grammar: a missing :N is one slot)."""
    return hostlib.merge_hosts(hostlib.parse_host_list(value, label=f"{var}={shown(value)}"))


def parse_lsf_hosts(value: str, var: str = "LSB_MCPU_HOSTS") -> list[Host]:
    """LSF's `host1 4 host2 4`: names and slot counts, in pairs."""
    words = value.split()
    if not words:
        raise _bad(var, value, "no hosts")
    if len(words) % 2:
        raise _bad(var, value, "expected pairs of a host name and a slot count")
    if len(words) // 2 > MAX_HOSTS:
        raise _bad(var, value, f"more than {MAX_HOSTS} hosts")
    entries = []
    where = f"{var}={shown(value)}"  # what a bad name's error starts with
    for name, count in zip(words[::2], words[1::2]):
        _host_name(name, where)
        if not _is_count(count):
            problem = f"slot count of {shown(name)} must be a whole number from 1 to {MAX_COUNT}, not {shown(count)}"
            raise _bad(var, value, problem)
        entries.append(Host(name, int(count)))
    return hostlib.merge_hosts(entries)


def parse_pe_hostfile(text: str, path: str, var: str = "PE_HOSTFILE") -> list[Host]:
    """Grid Engine's PE_HOSTFILE: a line per host and queue, `host slots queue@host range`;
    a host's slots are the sum of its lines, and the first line is the job's master host."""
    entries = []
    for lineno, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words:
            continue
        where = f"{var}: {path}:{lineno}"
        if len(words) < 2:
            raise LaunchError(f"{where}: expected `host slots queue range`, not {shown(line)}")
        _host_name(words[0], where)
        if not _is_count(words[1]):
            problem = f"slot count must be a whole number from 1 to {MAX_COUNT}, not {shown(words[1])}"
            raise LaunchError(f"{where}: {problem}")
        entries.append(Host(words[0], int(words[1])))
    if not entries:
        raise LaunchError(f"{var}: {path}: no hosts in the file")
    return hostlib.merge_hosts(entries)


def sge_nslots(env: Mapping[str, str]) -> int | None:
    """NSLOTS, the slots Grid Engine granted the job: its ranks when -n is not given, as mpirun."""
    return _env_count(env, "NSLOTS", "expected the job's number of slots (a whole number, at least 1)")


def _env_count(env: Mapping[str, str], var: str, expected: str) -> int | None:
    """A count the variable var gives, None when it is not set; expected says what it must be."""
    raw = env.get(var, "").strip()
    if not raw:
        return None
    if not _is_count(raw):
        raise _bad(var, raw, expected)
    return int(raw)


def parse_pbs_nodefile(text: str, path: str, var: str = "PBS_NODEFILE") -> list[Host]:
    """PBS/Torque's node file: one line per slot, a host repeated once per slot it has."""
    counts: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        name = line.strip()
        if not name:
            continue
        _host_name(name, f"{var}: {path}:{lineno}")
        counts[name] = counts.get(name, 0) + 1
    if not counts:
        raise LaunchError(f"{var}: {path}: no hosts in the node file")
    return [Host(name, count) for name, count in counts.items()]


def _read_text(path: str, var: str) -> str:
    """A file named by an environment variable, read as a hostfile is; errors name the variable."""
    try:
        return read_text(path, "host list", hostlib.HOSTFILE_MAX)
    except LaunchError as exc:
        raise LaunchError(f"{var}: {exc}") from None


def _hostfile(var: str, path: str) -> list[Host]:
    try:
        return hostlib.read_hostfile(path)
    except LaunchError as exc:
        raise LaunchError(f"{var}: {exc}") from None


def mlp_np(env: Mapping[str, str]) -> int | None:
    """MLP_MPI_NP, the platform's number of ranks (the default -n with its hosts)."""
    return _env_count(env, "MLP_MPI_NP", "expected a number of ranks (a whole number, at least 1)")


def from_environment(env: Mapping[str, str]) -> tuple[list[Host], str] | None:
    """The first host source set in env (hosts.ENVIRONMENT_SOURCES, in order), as (hosts, where
    they came from); None for none."""
    var = next((name for name in hostlib.ENVIRONMENT_SOURCES if env.get(name)), None)
    if var is None:
        return None
    value = env[var]
    if var in ("MLP_MPI_HOSTFILE", "OMPI_MCA_orte_default_hostfile"):
        return _hostfile(var, value), f"{var} {value}"
    if var == "MLP_MPI_HOSTS":
        return parse_mlp_hosts(value), var
    if var in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        return slurm_hosts(env), f"Slurm allocation ({var})"
    if var == "PE_HOSTFILE":
        return parse_pe_hostfile(_read_text(value, var), value), f"Grid Engine job's PE_HOSTFILE {value}"
    if var == "PBS_NODEFILE":
        return parse_pbs_nodefile(_read_text(value, var), value), f"PBS_NODEFILE {value}"
    return parse_lsf_hosts(value), var  # LSB_MCPU_HOSTS
