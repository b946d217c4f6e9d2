"""The first words of a --pmi-tcp connection and the tally of refused ones (agent/services/pmi_hello.py),
and the owner of a loopback connection's other end (host/tcp_peer.py)."""

from __future__ import annotations

import os
import socket
import struct
import sys

import pytest

from mpilaunch.agent.services.pmi_hello import ID, REFUSED, WAIT, Refusals, verdict
from mpilaunch.host.tcp_peer import diag_owner, owner_in, peer_uid, table_address


@pytest.mark.parametrize(
    ("buf", "ended", "said"),
    [
        (b"", False, (WAIT, 0)),
        (b"", True, ("silent", 0)),
        (b"cmd=initack pmi", False, (WAIT, 0)),
        (b"cmd=initack pmi", True, ("garbage", 0)),
        (b"cmd=initack pmiid=1234", True, ("garbage", 0)),  # closed, or out of time, before its newline
        (b"cmd=initack pmiid=1234\n", False, (ID, 1234)),
        (b"cmd=initack pmiid=1234\ncmd=init pmi_version=1\n", False, (ID, 1234)),
        (b"cmd=initack pmiid=-3\n", False, ("garbage", 0)),
        (b"cmd=initack pmiid=\xd9\xa3\n", False, ("garbage", 0)),  # a digit, but not an ASCII one
        (b"cmd=init pmi_version=2 pmi_subversion=0\n", False, ("pmi2", 0)),
        (b"    29cmd=fullinit;pmirank=0;", False, ("pmi2", 0)),  # a PMI-2 frame has no newline to wait for
        (b"GET / HTTP/1.0\r\n\r\n", False, ("garbage", 0)),
        (b"x" * 511, False, (WAIT, 0)),
        (b"x" * 512, False, ("garbage", 0)),
    ],
)
def test_verdict(buf: bytes, ended: bool, said: tuple[str, int]) -> None:
    assert verdict(buf, ended) == said


def test_the_first_refusal_is_said_and_the_others_summed_up_once() -> None:
    tally = Refusals()
    assert tally.summary("127.0.0.1:9") is None
    assert tally.add("wrong") == f"{REFUSED} (it presented a wrong or used PMI_ID); any more are summed up at the end"
    assert tally.summary("127.0.0.1:9") is None  # one refusal: its own line said it all
    for kind in ["silent"] * 3 + ["garbage", "foreign", "pmi2", "left"]:
        assert tally.add(kind, 1000) is None
    assert tally.summary("127.0.0.1:9") == (
        "mpilaunch: refused 8 connections to the PMI port 127.0.0.1:9 in all: 3 sent nothing, "
        "1 sent no PMI hello, 1 presented a wrong or used PMI_ID, 1 spoke PMI-2, which sends no PMI_ID, "
        "1 came from another user, 1 closed before it was answered"
    )


def test_the_first_refusal_of_a_pmi2_client_or_another_user_says_so() -> None:
    assert Refusals().add("pmi2") == (
        f"{REFUSED}: a PMI-2 client connected over --pmi-tcp, and PMI-2 does not send PMI_ID; "
        "drop --pmi-tcp to serve it over PMI_FD"
    )
    assert Refusals().add("foreign", 65534) == (
        "mpilaunch: refused a PMI connection from a process of another user (uid 65534); "
        "any more are summed up at the end"
    )


TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:A1B2 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1603 1
   1: 0100007F:C350 0100007F:A1B2 06 00000000:00000000 03:000007E7 00000000     0        0 0 3
   2: 0100007F:C350 0100007F:A1B2 01 00000000:00000000 00:00000000 00000000  1000        0 4711 1
   3: 0100007F:A1B2 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4712 1
   4: 0100007F:C351 0100007F:A1B2 04 00000000:00000000 00:00000000 00000000     0        0 0 1
"""


def test_owner_in_the_tcp_table_is_that_of_a_socket_a_process_holds() -> None:
    peer, ours = "0100007F:C350", "0100007F:A1B2"
    assert owner_in(TABLE, peer, ours) == 1000  # not the TIME_WAIT line above it
    assert owner_in(TABLE, ours, peer) == 0
    assert owner_in(TABLE, "0100007F:C351", ours) is None  # closed by its process: no inode
    assert owner_in(TABLE, "0100007F:C352", ours) is None


def test_the_kernel_s_answers_read() -> None:
    header = struct.pack("=IHHII", 36, 2, 0, 1, 0)
    assert diag_owner(header + struct.pack("=i", -2) + bytes(16)) is None  # ENOENT: no such socket
    with pytest.raises(OSError):
        diag_owner(header + struct.pack("=i", -22) + bytes(16))
    with pytest.raises(OSError):
        diag_owner(b"")


def test_the_owner_of_a_real_loopback_connection_by_both_ways() -> None:
    assert table_address("127.0.0.1", 80) == ("0100007F:0050" if sys.byteorder == "little" else "7F000001:0050")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()) as client:
            accepted, _ = listener.accept()
            with accepted:
                ours, peer = accepted.getsockname(), accepted.getpeername()
                assert peer_uid(ours, peer) == os.geteuid()
                with open("/proc/net/tcp") as handle:
                    assert owner_in(handle.read(), table_address(*peer), table_address(*ours)) == os.geteuid()
                assert peer_uid(ours, ("127.0.0.1", 1)) is None  # nobody connected from there
                client.close()
                assert peer_uid(ours, peer) is None  # its process let it go
