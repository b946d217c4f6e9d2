"""Rank program for tests: a PMI-2 client written from MPICH's pmi-2.0 message set, over PMI_FD.

It has its own framing code (not mpilaunch's), so the server is checked against an
independent reading of the protocol. argv[1] is a scenario; the rank prints each reply as
`R< body` (without the length prefix) and asserts what a real client relies on.

Why not a real client: the `mpich` wheel's libmpi is built without PMI-2 (see
tests/mpi/test_pmi2.py), so MPICH itself cannot be made to speak PMI-2 here.
"""

import os
import socket
import sys
import time

sock = socket.socket(fileno=int(os.environ["PMI_FD"]))
rank = int(os.environ["PMI_RANK"])
size = int(os.environ["PMI_SIZE"])
serial = 0


def frame(cmd: str, *pairs: tuple[str, object], thrid: bool = True) -> bytes:
    """`cmd=NAME;thrid=...;key=value;...` with `;` doubled in values, after a 6-digit length."""
    global serial
    serial += 1
    head = [("thrid", f"0x{rank}{serial:03d}")] if thrid else []
    body = f"cmd={cmd};" + "".join(f"{k}={str(v).replace(';', ';;')};" for k, v in [*head, *pairs])
    return f"{len(body):<6d}".encode() + body.encode()  # left-aligned, as MPICH 3's client pads it


def read_exact(n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise SystemExit(f"rank {rank}: PMI connection closed")
        data += chunk
    return data


def read_frame() -> dict[str, str]:
    body = read_exact(int(read_exact(6))).decode()
    print(f"{rank}< {body}", flush=True)
    fields, key, value, i = {}, "", [], 0
    current = None
    while i < len(body):
        if body[i] == ";" and body[i + 1 : i + 2] == ";":
            value.append(";")
            i += 2
            continue
        if body[i] == ";":
            fields[key] = "".join(value)
            key, value, current = "", [], None
        elif current is None and body[i] == "=":
            current = "value"
        elif current is None:
            key += body[i]
        else:
            value.append(body[i])
        i += 1
    return fields


def ask(cmd: str, *pairs: tuple[str, object]) -> dict[str, str]:
    request = frame(cmd, *pairs)
    sock.sendall(request)
    reply = read_frame()
    assert reply["cmd"] == f"{cmd}-response", reply
    thrid = request.decode().split("thrid=")[1].split(";")[0]
    assert reply.get("thrid") == thrid, (reply, thrid)
    return reply


def init_line() -> None:
    sock.sendall(b"cmd=init pmi_version=2 pmi_subversion=0\n")
    line = b""
    while not line.endswith(b"\n"):
        line += read_exact(1)
    print(f"{rank}< {line.decode().strip()}", flush=True)
    assert line == b"cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n", line


def fullinit() -> dict[str, str]:
    sock.sendall(frame("fullinit", ("pmirank", rank), thrid=False))
    reply = read_frame()
    assert reply["cmd"] == "fullinit-response" and reply["rc"] == "0", reply
    assert (reply["rank"], reply["size"], reply["pmi-version"]) == (str(rank), str(size), "2"), reply
    return reply


def session() -> None:
    """Everything MPICH's PMI-2 path uses, across two ranks of one host."""
    init_line()
    reply = fullinit()
    assert reply["appnum"] == "0" and "spawner-jobid" not in reply, reply
    jobid = ask("job-getid")["jobid"]
    assert ask("kvs-put", ("key", f"addr-{rank}"), ("value", f"tcp://10.0.0.{rank};port={rank}"))["rc"] == "0"
    assert ask("kvs-put", ("key", "k" * 65), ("value", "x")) == {
        "cmd": "kvs-put-response", "thrid": f"0x{rank}{serial:03d}", "rc": "-1", "errmsg": "key_length_out_of_range",
    }  # fmt: skip
    if rank == 0:
        assert ask("name-publish", ("name", "svc"), ("port", "port;0"))["rc"] == "0"
    assert ask("kvs-fence")["rc"] == "0"
    got = ask("kvs-get", ("jobid", jobid), ("srcid", 1 - rank), ("key", f"addr-{1 - rank}"))
    assert got["found"] == "TRUE" and got["value"] == f"tcp://10.0.0.{1 - rank};port={1 - rank}", got
    assert ask("kvs-get", ("jobid", jobid), ("key", "missing"))["found"] == "FALSE"
    assert ask("info-getjobattr", ("key", "PMI_process_mapping"))["value"] == f"(vector,(0,1,{size}))"
    assert ask("info-getjobattr", ("key", "universeSize"))["value"] == str(size)
    assert ask("info-getjobattr", ("key", "no_such_attr"))["found"] == "FALSE"
    # Node attributes: rank 1 waits for a key that rank 0 puts half a second later.
    if rank == 0:
        time.sleep(0.5)
        assert ask("info-putnodeattr", ("key", "shm-seg"), ("value", "seg;0"))["rc"] == "0"
    else:
        got = ask("info-getnodeattr", ("key", "shm-seg"), ("wait", "TRUE"))
        assert (got["found"], got["value"]) == ("TRUE", "seg;0"), got
    assert ask("info-getnodeattr", ("key", "never-put"), ("wait", "FALSE"))["found"] == "FALSE"
    assert ask("name-lookup", ("name", "svc"))["port"] == "port;0"
    assert ask("kvs-fence")["rc"] == "0"
    if rank == 0:
        assert ask("name-unpublish", ("name", "svc"))["rc"] == "0"
        missing = ask("name-lookup", ("name", "svc"))
        assert missing["rc"] != "0" and missing["errmsg"] == "service_not_found", missing
    else:
        unknown = ask("frobnicate", ("a", "b"))
        assert (unknown["rc"], unknown["errmsg"]) == ("-1", "unknown_command"), unknown
    assert ask("finalize")["rc"] == "0"
    print(f"rank {rank} ok", flush=True)


def mixed() -> None:
    """Rank 0 speaks PMI-1, rank 1 PMI-2: one barrier, one key space."""
    if rank == 1:
        init_line()
        fullinit()
        ask("kvs-put", ("key", "from-1"), ("value", "pmi2"))
        ask("kvs-fence")
        assert ask("kvs-get", ("key", "from-0"))["value"] == "pmi1"
        ask("finalize")
    else:
        reader = sock.makefile("rb")

        def line(text: str) -> str:
            sock.sendall(text.encode() + b"\n")
            reply = reader.readline().decode().strip()
            print(f"{rank}< {reply}", flush=True)
            return reply

        line("cmd=init pmi_version=1 pmi_subversion=1")
        kvs = line("cmd=get_my_kvsname").split("kvsname=")[1]
        line(f"cmd=put kvsname={kvs} key=from-0 value=pmi1")
        line("cmd=barrier_in")
        assert line(f"cmd=get kvsname={kvs} key=from-1") == "cmd=get_result rc=0 value=pmi2"
        line("cmd=finalize")
    print(f"rank {rank} ok", flush=True)


def frame_first() -> None:
    """No PMI-1 init line: the first bytes are a fullinit frame (hydra accepts that too)."""
    fullinit()
    ask("kvs-put", ("key", f"k{rank}"), ("value", rank))
    ask("kvs-fence")
    assert ask("kvs-get", ("key", f"k{1 - rank}"))["value"] == str(1 - rank)
    ask("finalize")
    print(f"rank {rank} ok", flush=True)


def spawn() -> None:
    """MPI_Comm_spawn over PMI-2: the parent asks for 2 children, which read the parent's preput key."""
    if os.environ.get("PMI_SPAWNED") == "1":
        init_line()
        reply = fullinit()
        greeting = ask("kvs-get", ("key", "greeting"))["value"]
        print(f"child {rank} of {size}: spawner-jobid={reply['spawner-jobid']} greeting={greeting}", flush=True)
        ask("finalize")
        return
    init_line()
    fullinit()
    jobid = ask("job-getid")["jobid"]
    print(f"parent jobid={jobid}", flush=True)
    reply = ask(
        "spawn", ("ncmds", 1), ("preputcount", 1), ("ppkey0", "greeting"), ("ppval0", "hello;world"),
        ("subcmd", sys.executable), ("maxprocs", 2), ("argc", 2), ("argv0", __file__), ("argv1", "spawn"),
        ("infokeycount", 0),
    )  # fmt: skip
    assert reply["rc"] == "0", reply
    ask("finalize")


def hostile(what: bytes) -> None:
    """Rank 1 sends `what` once initialized; rank 0 waits as a peer in a barrier would."""
    init_line()
    fullinit()
    if rank == 1:
        sock.sendall(what)
    time.sleep(30)


def raw(body: bytes) -> bytes:
    return b"%6d" % len(body) + body


HOSTILE = {
    "bad_length": b"12ab56cmd=kvs-fence;",
    "too_long": b"999999cmd=kvs-put;key=a;value=",
    "no_cmd": raw(b"key=a;value=b;"),
    "no_equals": raw(b"cmd=kvs-put;novalue;"),
    "bad_key": raw(b"cmd=kvs-put;k y=1;"),
    "not_ascii": raw(b"cmd=kvs-put;key=\xff;"),
    "garbage": b"\xff\xfe this is not PMI at all\n",
}

scenario = sys.argv[1]
if scenario in HOSTILE:
    hostile(HOSTILE[scenario])
elif scenario == "mid_frame":
    init_line()
    fullinit()
    if rank == 1:
        sock.sendall(b"    60cmd=kvs-put;key=")  # 60 bytes announced, 12 sent: then it hangs up
        sock.close()
    time.sleep(30)
elif scenario == "flood":
    init_line()
    fullinit()
    if rank == 1:  # requests, and never a read: the replies pile up in the agent's socket
        request = frame("job-getid") * 1000
        try:
            while True:
                sock.sendall(request)
        except OSError:  # the agent gave up on us
            pass
    time.sleep(30)
elif scenario == "abort":
    init_line()
    fullinit()
    if rank == 1:
        sock.sendall(frame("abort", ("isworld", "TRUE"), ("exitcode", 7), ("message", "boom;bang")))
    time.sleep(30)
else:
    {"session": session, "mixed": mixed, "frame_first": frame_first, "spawn": spawn}[scenario]()
