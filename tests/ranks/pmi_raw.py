"""Rank program for tests: speaks PMI-1 by hand over PMI_FD, as a hostile or a pedantic client would.

argv[1] is a scenario name; the rank prints what the server answered, one reply per line.
"""

import os
import socket
import sys
import time

sock = socket.socket(fileno=int(os.environ["PMI_FD"]))
reader = sock.makefile("rb")
rank = int(os.environ["PMI_RANK"])


def ask(line: str) -> str:
    sock.sendall(line.encode() + b"\n")
    reply = reader.readline().decode().strip()
    print(reply, flush=True)
    return reply


scenario = sys.argv[1]
if scenario == "limits":
    ask("cmd=init pmi_version=1 pmi_subversion=1")
    maxes = dict(w.split("=", 1) for w in ask("cmd=get_maxes").split()[1:])
    kvs = ask("cmd=get_my_kvsname").split("kvsname=")[1]
    key = f"k{rank}".ljust(int(maxes["keylen_max"]), "k")
    value = "v" * int(maxes["vallen_max"])
    ask(f"cmd=put kvsname={kvs} key={key} value={value}")
    ask(f"cmd=put kvsname={kvs} key={key}x value=1")
    ask(f"cmd=put kvsname={kvs} key=short value={value}v")
    ask("cmd=put kvsname=other key=a value=1")
    ask("cmd=barrier_in")
    peer = f"k{1 - rank}".ljust(int(maxes["keylen_max"]), "k")
    got = ask(f"cmd=get kvsname={kvs} key={peer}")
    assert got == f"cmd=get_result rc=0 value={value}", got[:80]
    ask(f"cmd=get kvsname={kvs} key=missing")
    ask("cmd=no_such_command a=b")
    ask("cmd=finalize")
elif scenario == "garbage":
    ask("cmd=init pmi_version=1 pmi_subversion=1")
    if rank == 1:
        sock.sendall(b"\xff\xfe not pmi at all\n")
    time.sleep(30)
elif scenario == "long_line":
    if rank == 1:
        sock.sendall(b"cmd=put " + b"x" * 100000)
    time.sleep(30)
elif scenario == "long_line_nl":
    if rank == 1:
        sock.sendall(b"cmd=put key=" + b"x" * 6000 + b"\n")
    time.sleep(30)
elif scenario == "hangup":
    ask("cmd=init pmi_version=1 pmi_subversion=1")
    if rank == 1:
        sock.close()
        reader.close()
    time.sleep(30)
