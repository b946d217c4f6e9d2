"""torchrun's command line, read as torchrun 2.13 reads it (torch/distributed/run.py): under
mpilaunch's own name (`mpilaunch --nproc-per-node 2 train.py`) and as `torchrun`.

Two ways across nodes, as torchrun users run it: one mpilaunch for the whole job (`-H`, a
hostfile or an allocation, with --nproc-per-node ranks on each host), or torchrun's own, one
launcher per node (`--nnodes 2 --node-rank $SLURM_NODEID --master-addr ...`), which starts its
node's ranks and meets the other nodes' launchers at the endpoint. A `.py` program runs with
this interpreter (`python -u`), `-m` as a module, `--no-python` as it is.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from mpilaunch.cli.cliopts import (
    FLAG,
    IGNORED,
    INT_MIN0,
    INT_MIN1,
    MAX_RANKS,
    STREAMS,
    TORCHRUN,
    Opt,
    ignored,
    said_ignored,
)
from mpilaunch.errors import LaunchError
from mpilaunch.plan.spec import AppContext, TorchRun

RULES = "torchrun"  # its failure rules: the launcher's status 1 when a worker fails (launcher/decide/policy.py)
MINE = (TORCHRUN,)
# fmt: off
ROWS: tuple[Opt, ...] = (  # torchrun 2.13's words, with their underscore spellings
    Opt("nproc_per_node", "--nproc-per-node --nproc_per_node", metavar="N|auto|cpu|gpu", whose=MINE,
        help="Ranks per node (with -H, a hostfile or an allocation: on each of its hosts)."),
    Opt("nnodes", "--nnodes", metavar="N|MIN:MAX", whose=MINE, help="Node count; more than 1: one launcher per node."),
    Opt("node_rank", "--node-rank --node_rank", check=INT_MIN0, maximum=MAX_RANKS, whose=MINE,
        help="This node's rank."),
    Opt("master_addr", "--master-addr --master_addr", metavar="HOST", whose=MINE, help="The rendezvous host."),
    Opt("master_port", "--master-port --master_port", check=INT_MIN1, maximum=65535, whose=MINE,
        help="The rendezvous port."),
    Opt("standalone", "--standalone", FLAG, whose=MINE, help="A single-node job on a free port."),
    Opt("rdzv_backend", "--rdzv-backend --rdzv_backend", metavar="static|c10d", whose=MINE, help="The rendezvous."),
    Opt("rdzv_endpoint", "--rdzv-endpoint --rdzv_endpoint", metavar="HOST[:PORT]", whose=MINE,
        help="Where the nodes meet."),
    Opt("rdzv_id", "--rdzv-id --rdzv_id", metavar="ID", whose=MINE, help="The run id (TORCHELASTIC_RUN_ID)."),
    Opt("rdzv_conf", "--rdzv-conf --rdzv_conf", metavar="K=V,...", whose=MINE, help="Rendezvous settings."),
    Opt("monitor_interval", "--monitor-interval --monitor_interval", metavar="S", whose=MINE, help="Accepted."),
    Opt("start_method", "--start-method --start_method", metavar="spawn|fork", whose=MINE, help="Accepted."),
    Opt("role", "--role", metavar="NAME", whose=MINE, help="The workers' role (ROLE_NAME)."),
    Opt("module", "-m --module", FLAG, whose=MINE, help="The program is a Python module (python -m)."),
    Opt("no_python", "--no-python --no_python", FLAG, whose=MINE, help="Run the program as it is, not with Python."),
    Opt("run_path", "--run-path --run_path", FLAG, whose=MINE, help="Run the script with runpy.run_path."),
    Opt("log_dir", "--log-dir --log_dir", metavar="DIR", whose=MINE, help="The log folder (--output-filename)."),
    Opt("redirects", "-r --redirects", check=STREAMS, metavar="0-3|N:M,...", whose=MINE,
        help="Streams to files only."),
    Opt("tee", "-t --tee", check=STREAMS, metavar="0-3|N:M,...", whose=MINE, help="Streams to files and the console."),
    Opt("local_ranks_filter", "--local-ranks-filter --local_ranks_filter", metavar="0,1", whose=MINE,
        help="Only these local ranks' output on the console."),
    Opt("local_addr", "--local-addr --local_addr", metavar="ADDR", whose=MINE, help="This node's address."),
    Opt("virtual_local_rank", "--virtual-local-rank --virtual_local_rank", FLAG, whose=MINE,
        help="LOCAL_RANK 0 for every rank, each seeing its own GPU as device 0."),
    Opt("shutdown_timeout", "--shutdown-timeout --shutdown_timeout", metavar="S", whose=MINE,
        help="Seconds the ranks get after a signal stopped the job, before SIGKILL (default 30)."),
    *ignored("event-log-handler; logs-specs; numa-binding; signals-to-handle; duplicate-stdout-filters; "
             "duplicate-stderr-filters", TORCHRUN),
)
# fmt: on
ENVIRONMENT = (
    ("PET_<OPTION>", "an option not given (PET_NPROC_PER_NODE=2 is --nproc-per-node 2)"),
    ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "--shutdown-timeout, when not given"),
)
STATIC_PORT = 29500  # torchrun's MASTER_PORT for a static rendezvous across nodes
C10D_PORT = 29400  # ... and its --rdzv-endpoint port for c10d
GRACE = 30.0  # torchrun's seconds between SIGTERM and SIGKILL of its workers
RUN_PATH = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def torch_options(
    values: dict[str, object], given: set[str], name: str, apps: list[AppContext], env: Mapping[str, str]
) -> tuple[dict[str, object], list[str]]:
    """torchrun's words taken out of the parsed values: the Options fields they set (torch, and
    placement), with apps rewritten to what runs; notes for words that mean nothing here."""
    words = {opt.name: values.pop(opt.name, opt.unset) for opt in ROWS}
    if not (name == "torchrun" or given & words.keys()):  # only torchrun has these: one makes the line torchrun's
        return {}, []
    for opt in ROWS:  # torchrun reads PET_<NAME> for an option not given (0 or 1 for a flag)
        key = opt.name
        if key not in given and IGNORED not in opt.roles and f"PET_{key.upper()}" in env:
            words[key] = _env_flag(key, env) if opt.kind == FLAG else env[f"PET_{key.upper()}"]
    notes = said_ignored(words, TORCHRUN, "torchrun's {flag} means nothing here: ignored")
    backend = str(words["rdzv_backend"] or "static").lower()
    if backend not in ("static", "c10d"):
        raise LaunchError(
            f"--rdzv-backend {backend}: mpilaunch's launchers meet through a store of their own; use "
            "--rdzv-backend static or c10d (the same here)"
        )
    nproc = nproc_per_node(str(words["nproc_per_node"] or "1"))
    low, nnodes = node_count(words["nnodes"], name)
    if any(a.np is not None for a in apps) and "nproc_per_node" in given:
        raise LaunchError("-n and --nproc-per-node: give one of them (torchrun's is ranks per node)")
    node_rank = None if words["node_rank"] is None else _whole("--node-rank", words["node_rank"], 0, 65536)
    conf = rdzv_conf(words["rdzv_conf"])
    endpoint = None
    standalone = bool(words["standalone"])
    meets = node_rank is not None or bool(words["rdzv_endpoint"] or words["master_addr"])
    asked = (low, nnodes or 0) if words["nnodes"] is not None else (0, 0)
    if standalone:
        low = nnodes = 1
        asked = (1, 1)
    elif low == 1 and not meets:
        nnodes = 1  # MIN:MAX from 1 with nowhere to meet: this machine is the job, or the hosts
    per_node = nnodes is not None and nnodes > 1 and meets
    asked = (0, 0) if per_node else asked  # one launcher for the job: its hosts are torchrun's nodes
    if per_node and given & {"hosts", "hostfile"}:
        raise LaunchError(
            "-H or a hostfile with torchrun's launcher per node (--node-rank, --master-addr, --rdzv-endpoint): each "
            "node's launcher starts its own ranks; give the hosts to one mpilaunch without those, or drop them"
        )
    if per_node:
        if backend == "static" and (node_rank is None or low != nnodes):
            raise LaunchError(
                f"--nnodes {words['nnodes']} with torchrun's static rendezvous: give this node's --node-rank and a "
                "fixed N (or --rdzv-backend c10d, which numbers the nodes as they meet)"
            )
        if low != nnodes:
            node_rank = None  # c10d numbers the nodes itself (torchrun ignores --node-rank but for static)
        endpoint = _endpoint(words, backend)
        if node_rank is not None and not 0 <= node_rank < nnodes:
            raise LaunchError(f"--node-rank {node_rank}: expected 0 to {nnodes - 1} for --nnodes {nnodes}")
    torch = TorchRun(
        nproc_per_node=nproc,
        nnodes=nnodes,
        node_rank=node_rank if per_node else None,
        endpoint=endpoint,
        min_nodes=low if per_node and low else 0,
        nodes_asked=asked,
        **conf,
        **(_one_node_master(words, backend) if not per_node and not standalone else {}),
        run_id=_run_id(words, backend, nnodes if per_node else None, standalone),
        role=str(words["role"] or "default"),
        standalone=standalone,
        local_ranks_filter=_ranks_filter(words["local_ranks_filter"]),
        redirects=std_streams("--redirects", words["redirects"]),
        tee=std_streams("--tee", words["tee"]),
        virtual_local_rank=bool(words["virtual_local_rank"]),
    )
    apps[:] = [a._replace(argv=script_argv(a.argv, words)) for a in apps]
    fields: dict[str, object] = {"torch": torch, **_graces(words, given, values, env)}
    if per_node:  # as under torchrun, no MPI process manager: one MPI job cannot span the nodes' launchers
        if "mpi" in given and str(values.get("mpi")) != "none":
            raise LaunchError(
                f"--mpi {values.get('mpi')} with torchrun's one launcher per node (--nnodes/--node-rank): the "
                "nodes' ranks would not share one MPI job; start it from one mpilaunch (-H or a hostfile with "
                "--nproc-per-node)"
            )
        values["mpi"] = "none"
    if not per_node and not any(a.np is not None for a in apps):
        fields["npernode"] = nproc  # on each host (or this machine's nproc)
    if words["log_dir"] is not None and values.get("output_filename") is None:
        fields["output_filename"] = str(words["log_dir"])
    return fields, notes


def script_argv(argv: tuple[str, ...], words: Mapping[str, object]) -> tuple[str, ...]:
    """What runs for torchrun's training script: `python -u script`, `-m module`, runpy's
    run_path, or (--no-python) the program itself. A `--` right after the script is dropped,
    as torchrun's argparse drops it (`x.py -- --lr 1` runs `x.py --lr 1`)."""
    if argv[1:2] == ("--",):
        argv = (argv[0], *argv[2:])
    if words["no_python"]:
        return argv
    if words["module"]:
        return (sys.executable, "-u", "-m", *argv)
    if words["run_path"]:
        return (sys.executable, "-u", "-c", RUN_PATH, *argv)
    return (sys.executable, "-u", *argv)


def nproc_per_node(value: str) -> int:
    """torchrun's --nproc-per-node: a number, or cpu and auto (this machine's CPUs: no
    accelerator is read here), or gpu (the GPUs nvidia-smi counts)."""
    if value.isascii() and value.isdigit() and 1 <= int(value) <= 65536:
        return int(value)
    if value in ("cpu", "auto"):
        return len(os.sched_getaffinity(0))
    if value == "gpu":
        from mpilaunch.host.hostinfo import count_gpus

        found = count_gpus(os.environ.get("PATH", os.defpath))
        count = found.get("count")
        if not count:
            why = found.get("error") or ("nvidia-smi counts none" if count == 0 else "no nvidia-smi on PATH")
            raise LaunchError(f"--nproc-per-node gpu: no GPU found on this machine ({why})")
        return int(count)
    raise LaunchError(f"--nproc-per-node {value!r}: expected a number from 1, auto, cpu or gpu")


def node_count(value: object, name: str) -> tuple[int, int | None]:
    """torchrun's --nnodes: N or MIN:MAX, as (MIN, MAX); (0, None) when not given under
    mpilaunch's name (the hosts decide), (1, 1) under torchrun's."""
    if value is None:
        return (1, 1) if name == "torchrun" else (0, None)
    text = str(value)
    low, colon, high = text.partition(":")
    high = high if colon else low  # "2:" has no maximum, which torchrun refuses too
    if not (low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high) <= 65536):
        raise LaunchError(f"--nnodes {text!r}: expected N or MIN:MAX (MIN <= MAX)")
    return int(low), int(high)


CONF_TIMEOUTS = {"join_timeout": "join_timeout", "last_call_timeout": "last_call"}


def rdzv_conf(value: object) -> dict[str, object]:
    """torchrun's --rdzv-conf K=V,...: of c10d's keys, join_timeout, last_call_timeout and
    is_host change the meeting here; the others are read by nothing, as by torchrun's backends."""
    fields: dict[str, object] = {}
    for part in str(value or "").split(","):
        if not part.strip():
            continue
        key, eq, text = part.partition("=")
        key, text = key.strip(), text.strip()
        if not eq or not key:
            raise LaunchError(f"--rdzv-conf {value!r}: expected KEY=VALUE,...")
        if key in CONF_TIMEOUTS:
            fields[CONF_TIMEOUTS[key]] = float(_whole(f"--rdzv-conf {key}", text, 0, 86400))
        elif key == "is_host":  # torch's get_as_bool
            if text.lower() not in ("1", "true", "t", "yes", "y", "0", "false", "f", "no", "n"):
                raise LaunchError(f"--rdzv-conf is_host={text}: expected true or false")
            fields["is_host"] = text.lower() in ("1", "true", "t", "yes", "y")
    return fields


def _endpoint(words: Mapping[str, object], backend: str) -> tuple[str, int]:
    """Where the nodes' launchers meet: --rdzv-endpoint HOST[:PORT], else --master-addr:--master-port;
    read as torch's parse_rendezvous_endpoint reads it, refused where torch refuses it."""
    text = str(words["rdzv_endpoint"] or "").strip()
    if text:
        bracketed = text.startswith("[") and text.endswith("]")  # [IPv6] without a port, as torchrun reads it
        host, colon, port = text.rpartition(":") if ":" in text and not bracketed else (text, "", "")
        if len(host) > 1 and host[0] == "[" and host[-1] == "]":
            host = host[1:-1]
        good_port = not colon or (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536)
        if not (good_port and host_word(host)):
            raise LaunchError(f"--rdzv-endpoint {text!r}: expected HOST[:PORT]")
        return host, int(port) if colon else C10D_PORT if backend == "c10d" else STATIC_PORT
    if not words["master_addr"]:
        raise LaunchError(
            "--nnodes N: say where the nodes meet, with --master-addr (and --master-port) or --rdzv-endpoint"
        )
    port = STATIC_PORT if words["master_port"] is None else _whole("--master-port", words["master_port"], 1, 65535)
    return _master_addr(words["master_addr"]), port


def host_word(host: str) -> bool:
    """A host as torch takes one ([\\w.:-]+): labels, an IPv4 or an IPv6 address; no byte that
    is not UTF-8 (a surrogate here), no blank."""
    return bool(host) and all(c.isalnum() or c in "_.:-" for c in host)


def _master_addr(value: object) -> str:
    text = str(value).strip()
    if not host_word(text):
        raise LaunchError(f"--master-addr {text!r}: expected a host name or an address")
    return text


def _graces(
    words: Mapping[str, object], given: set[str], values: Mapping[str, object], env: Mapping[str, str]
) -> dict[str, float]:
    """torchrun's waits before SIGKILL: 30 s for the other workers once one failed, and after a
    signal stopped it --shutdown-timeout (else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s);
    mpilaunch's own --kill-timeout, when given, is both."""
    kill = float(values["kill_timeout"]) if "kill_timeout" in given else GRACE  # type: ignore[arg-type]
    text = words["shutdown_timeout"] or env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    stop = kill if text is None else float(_whole("--shutdown-timeout", text, 0, 3600))
    return {"kill_timeout": kill, "signal_grace": stop}


def _run_id(words: Mapping[str, object], backend: str, nnodes: int | None, standalone: bool) -> str:
    """TORCHELASTIC_RUN_ID as torchrun sets it: a fresh id ("": the job's) where it makes its own
    rendezvous on a free port (--standalone; one node, static, no --master-port or endpoint),
    else --rdzv-id or `none`, the same on every node."""
    own = backend == "static" and not words["rdzv_endpoint"] and words["master_port"] is None and (nnodes or 1) == 1
    return "" if standalone or own else str(words["rdzv_id"] or "none")


def _one_node_master(words: Mapping[str, object], backend: str) -> dict[str, object]:
    """On one node, torchrun's static rendezvous with --master-port (its only case that reads
    --master-addr and --master-port) gives them to the ranks; without it, a free port."""
    if backend != "static" or words["rdzv_endpoint"] or words["master_port"] is None:
        return {}
    port = _whole("--master-port", words["master_port"], 1, 65535)
    return {"master_addr": _master_addr(words["master_addr"]) if words["master_addr"] else "", "master_port": port}


def _whole(option: str, value: object, low: int, high: int) -> int:
    """A number torchrun's option (or its PET_ variable, not checked as the command line is) gives."""
    text = str(value).strip()
    if not (text.isascii() and text.isdigit() and low <= int(text) <= high):
        raise LaunchError(f"{option} {text!r}: expected a number from {low} to {high}")
    return int(text)


def _env_flag(key: str, env: Mapping[str, str]) -> bool:
    """PET_STANDALONE and the like: 0 is off, another number on (torchrun's check_env)."""
    text = env[f"PET_{key.upper()}"].strip()
    if not (text.isascii() and text.lstrip("-").isdigit()):
        raise LaunchError(f"PET_{key.upper()}={text!r}: expected 0 or 1")
    return int(text) != 0


def std_streams(option: str, value: object) -> tuple[tuple[int, int], ...]:
    """torchrun's -r/--redirects and -t/--tee: 0 none, 1 stdout, 2 stderr, 3 both, for every
    local rank ("3") or per local rank ("0:3,1:1", the others none)."""
    text = str(value or "").strip()
    if not text:
        return ()
    if text.isdigit() and int(text) <= 3:
        return ((-1, int(text)),)
    rules = []
    for part in text.split(","):
        who, _, mask = part.strip().partition(":")
        if not (who.isdigit() and mask.isdigit() and int(mask) <= 3):
            raise LaunchError(f"{option} {text!r}: expected 0 to 3 (none, stdout, stderr, both) or LOCAL_RANK:0-3,...")
        rules.append((int(who), int(mask)))
    return tuple(rules)


def _ranks_filter(value: object) -> tuple[int, ...]:
    if not value:
        return ()
    parts = str(value).split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise LaunchError(f"--local-ranks-filter {value!r}: expected local ranks, comma separated (0,1,2)")
    return tuple(int(p) for p in parts)


def streams_value(text: str) -> bool:
    """Whether text is a value of -r/-t (0 to 3, or LOCAL_RANK:0-3 pairs joined by commas): `-t3` is
    --tee 3, `-topolib` no word of torchrun's."""
    import re

    return re.fullmatch(r"[0-3]|[0-9]+:[0-3](,[0-9]+:[0-3])*", text) is not None
