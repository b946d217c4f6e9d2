"""PMI-2 wire format and server, in process: frames by example, malformed frames, round trips
in any chunking, a server fed any requests."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpilaunch.agent.services import pmi2
from mpilaunch.agent.services.pmi1 import ProtocolError
from mpilaunch.protocol.messages import PmiJob, encode


def test_frames_by_example() -> None:
    frame = pmi2.format_frame("kvs-put", [("thrid", "0x1"), ("key", "a"), ("value", "x;y")])
    assert frame == b"    39cmd=kvs-put;thrid=0x1;key=a;value=x;;y;"
    body, used = pmi2.split_frame(frame + b"more")
    assert used == len(frame)
    assert pmi2.parse_body(body) == [("cmd", "kvs-put"), ("thrid", "0x1"), ("key", "a"), ("value", "x;y")]
    assert pmi2.split_frame(frame[:-1]) is None and pmi2.split_frame(b"   ") is None
    # MPICH 3's client left-aligns the length; the last `;` may be missing; values may be empty.
    assert pmi2.parse_body(pmi2.split_frame(b"19    cmd=finalize;thrid=")[0]) == [("cmd", "finalize"), ("thrid", "")]
    assert pmi2.response("kvs-get", "7", 0, [("found", "TRUE"), ("value", ";")]) == (
        b"    54cmd=kvs-get-response;thrid=7;rc=0;found=TRUE;value=;;;"
    )
    assert pmi2.response("finalize", None) == b"    27cmd=finalize-response;rc=0;"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"12ab56cmd=x;", "bad PMI-2 length prefix"),
        (b"-00001cmd=x;", "bad PMI-2 length prefix"),
        (b"999999", "a PMI-2 frame of 999999 bytes"),
        (b"     0", "without cmd="),
        (b"     5cmd=;", "without cmd="),
        (b"     6key=a;", "without cmd="),
        (b"    10cmd=x;oops", "field without '='"),
        (b"    10cmd=x;=abc", "bad PMI-2 key"),
        (b"     6cmd=\xe9;", "not ASCII"),
    ],
)
def test_malformed_frames_are_refused(data: bytes, words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        got = pmi2.split_frame(data)
        assert got is not None
        pmi2.parse_body(got[0])


def test_spawn_request_with_two_programs() -> None:
    pairs = pmi2.parse_body(
        b"cmd=spawn;thrid=1;ncmds=2;preputcount=1;ppkey0=k;ppval0=v;"
        b"subcmd=/bin/a;maxprocs=2;argc=2;argv0=x;argv1=y;infokeycount=1;infokey0=wdir;infoval0=/tmp;"
        b"subcmd=/bin/b;maxprocs=1;argc=0;"
    )
    assert pmi2.spawn_apps(pairs) == [
        {"nprocs": 2, "argv": ["/bin/a", "x", "y"], "preput": {"k": "v"}, "info": {"wdir": "/tmp"}, "wdir": "/tmp"},
        {"nprocs": 1, "argv": ["/bin/b"], "preput": {}, "info": {}},
    ]
    for bad in (b"cmd=spawn;ncmds=2;subcmd=a;maxprocs=1;", b"cmd=spawn;subcmd=a;maxprocs=0;", b"cmd=spawn;subcmd=a;"):
        with pytest.raises((KeyError, ValueError)):
            pmi2.spawn_apps(pmi2.parse_body(bad))


KEYS = st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True)


VALUES = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


@given(
    cmd=st.from_regex(r"[a-z-]{1,20}", fullmatch=True),
    pairs=st.lists(st.tuples(KEYS, VALUES), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
)
@settings(max_examples=400, deadline=None)
def test_fuzz_round_trip_in_any_chunking(cmd: str, pairs: list[tuple[str, str]], cuts: list[int]) -> None:
    """format -> bytes cut anywhere -> split_frame/parse_body gives back the same fields, twice."""
    stream = pmi2.format_frame(cmd, pairs) * 2
    bounds = [0, *sorted({min(cut, len(stream)) for cut in cuts}), len(stream)]
    buf, out = bytearray(), []
    for start, end in zip(bounds, bounds[1:]):
        buf += stream[start:end]
        while (got := pmi2.split_frame(buf)) is not None:
            del buf[: got[1]]
            out.append(pmi2.parse_body(got[0]))
    assert out == [[("cmd", cmd), *pairs]] * 2 and not buf


@given(st.binary(max_size=300))
@settings(max_examples=1000, deadline=None)
def test_fuzz_parser_only_raises_protocol_error(data: bytes) -> None:
    for candidate in (data, b"%6d" % len(data) + data, b"%6d" % max(0, len(data) - 6) + data):
        try:
            got = pmi2.split_frame(candidate)
            if got is not None:
                pairs = pmi2.parse_body(got[0])
                assert pairs[0][0] == "cmd" and pairs[0][1]
                if pairs[0][1] == "spawn":
                    pmi2.spawn_apps(pairs)
        except ProtocolError:
            pass
        except (KeyError, ValueError) as exc:  # spawn_apps' refusal, answered rc=-1 by the server
            assert not isinstance(exc, UnicodeError)


JOB = PmiJob(job=1, size=2, universe=2, kvsname="kvs_t_1", mapping="(vector,(0,1,2))", preput={})


FIELD_KEYS = ["key", "value", "wait", "name", "port", "jobid", "exitcode", "message", "thrid", "ncmds", "subcmd"]


COMMANDS = ["fullinit", "job-getid", "kvs-put", "kvs-get", "kvs-fence", "info-putnodeattr", "info-getnodeattr"]


FIELD_VALUES = st.sampled_from(["", "0", "1", "-1", "--5", "TRUE", "x;y", "9" * 30])


REQUESTS = st.builds(
    pmi2.format_frame,
    st.sampled_from(COMMANDS),
    st.lists(st.tuples(st.sampled_from(FIELD_KEYS), FIELD_VALUES), max_size=8),
)


V1_COMMANDS = ["init", "get_maxes", "put", "get", "barrier_in", "abort", "publish_name", "lookup_name", "spawn"]


V1_KEYS = ["kvsname", "key", "value", "exitcode", "service", "port", "pmi_version", "nprocs", "execname", "totspawns"]


V1_LINES = st.builds(
    lambda cmd, pairs: (f"cmd={cmd} " + " ".join(f"{k}={v}" for k, v in pairs) + "\n").encode(),
    st.sampled_from(V1_COMMANDS),
    st.lists(st.tuples(st.sampled_from(V1_KEYS), st.sampled_from(["", "1", "--5", "2", "kvs_t_1", "a b"])), max_size=5),
)


@given(
    st.lists(st.one_of(REQUESTS, V1_LINES, st.sampled_from([b"endcmd\n"]), st.binary(max_size=80)), max_size=8),
    st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_fuzz_server_answers_or_refuses_but_never_raises(messages: list[bytes], init_line: bool) -> None:
    """Whatever a rank sends, the job's PMI server answers it or reports the rank (pmi_error); it never raises."""
    from mpilaunch.agent.services.pmi_server import JobServer
    from mpilaunch.protocol import wire

    sent: list[bytes] = []
    service = JobServer(JOB, lambda message: sent.append(encode(message)))
    ours, theirs = service.attach(0, 0, 0)
    theirs.setblocking(False)
    try:
        for data in [b"cmd=init pmi_version=2 pmi_subversion=0\n"] * init_line + messages:
            theirs.sendall(data)
            alive = service.readable(ours.fileno())
            try:
                while theirs.recv(1 << 16):
                    pass
            except BlockingIOError:
                pass
            if not alive:
                errors = [f for f in wire.Decoder().feed(b"".join(sent)) if f[1]["op"] == "pmi_error"]
                assert errors and errors[-1][1]["error"].startswith("PMI protocol error: ")
                break
    finally:
        ours.close()
        theirs.close()
