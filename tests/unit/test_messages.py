"""The control messages: one typed record each, checked when decoded, every one handled by its
receiver, and the catalogue in docs/architecture.md generated from the records."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpilaunch.agent.agent import Agent
from mpilaunch.launcher.loop.controller import Controller
from mpilaunch.protocol import messages, wire
from mpilaunch.protocol.messages import (
    DOWN,
    DOWN_MESSAGES,
    UP,
    UP_MESSAGES,
    Exited,
    Launch,
    MessageError,
    PmiJob,
    RankSpec,
    RelayHost,
    RelayHosts,
    SshSpec,
    catalogue,
    decode,
    encode,
)
from tests.conftest import ROOT

LAUNCH = Launch(
    job=1,
    ranks=(RankSpec(proc=0, rank=0, local_rank=0, app=0, argv=("python", "-c", "pass"), wdir="/", env={"A": "1"}),),
    env={"B": "2"},
    services=("pmi", "openmpi-guard"),
    pmi=PmiJob(job=1, size=1, universe=2, kvsname="kvs_x_1", mapping="(vector,(0,1,1))", preput={"k": "v"}),
    merge=True,
    bind_to="core",
    report_bindings=False,
    drop_prefixes=("PMI_",),
    drop_names=("PMI_FD",),
)


def round_trip(message: object, sender: str) -> object:
    ((kind, value),) = wire.Decoder().feed(encode(message))  # type: ignore[arg-type]
    assert kind == wire.CONTROL
    return decode(value, sender)  # type: ignore[arg-type]


def test_nested_records_round_trip() -> None:
    assert round_trip(LAUNCH, DOWN) == LAUNCH
    tree = RelayHosts(
        ssh=SshSpec(config=None, accept_new=True),
        command="python3 -c x",
        hosts=(RelayHost(3, "node3", None, 2222, (RelayHost(5, "node5", "bob", None, ()),)),),
    )
    assert round_trip(tree, DOWN) == tree


def test_each_op_is_the_records_name_and_names_are_unique() -> None:
    assert messages.op_name(messages.PmiFenceDone) == "pmi_fence_done"
    ops = [cls.op for cls in {*DOWN_MESSAGES, *UP_MESSAGES}]  # type: ignore[attr-defined]
    # 27, the PMIx fence both ways, PMIx's direct modex (4), spawn, collectives across jobs and names (9),
    # stacks (2)
    assert len(ops) == len(set(ops)) == 46


@pytest.mark.parametrize(
    ("obj", "sender", "words"),
    [
        ({"op": "launch"}, DOWN, "launch: no job"),
        ({"op": "launch", "job": 1, "ranks": "abc"}, DOWN, "launch.ranks: expected an array"),
        ({"op": "kill", "grace": "soon"}, DOWN, "kill.grace: expected a number"),
        ({"op": "kill", "grace": True}, DOWN, "kill.grace: expected a number"),
        ({"op": "signal", "sig": 2.0}, DOWN, "signal.sig: expected an integer"),
        ({"op": "exited", "proc": 0, "status": 0}, DOWN, "no down message is called 'exited'"),
        ({"op": "launch", "job": 1, "ranks": []}, UP, "no up message is called 'launch'"),
        ({"op": "x"}, UP, "no up message is called 'x'"),
        ({"op": "started", "proc": 0, "pid": None}, UP, "started.pid: expected an integer"),
        ({"op": "pmi_fence", "job": 1, "kvs": {"a": 1}}, UP, "pmi_fence.kvs: expected a string"),
        ({"op": "pmi_spawn", "job": 1, "proc": 0, "req": 1, "apps": [{}]}, UP, "pmi_spawn.apps: no nprocs"),
    ],
)
def test_decoding_checks_every_field(obj: dict, sender: str, words: str) -> None:
    with pytest.raises(MessageError, match=words):
        decode(obj, sender)
    assert issubclass(MessageError, wire.FrameError)  # receivers catch one error type


def test_defaults_fill_missing_fields_and_unknown_fields_are_ignored() -> None:
    message = decode({"op": "exited", "proc": 2, "status": -15, "pmi": "old field"}, UP)
    assert message == Exited(proc=2, status=-15, mpi="new", cpu=None, rss=None)


@given(st.dictionaries(st.sampled_from(["op", "proc", "pid", "job", "kvs", "grace", "sig", "apps"]), st.integers()))
@settings(max_examples=200)
def test_decoding_anything_raises_only_message_errors(obj: dict) -> None:
    obj.setdefault("op", "started")
    for sender in (UP, DOWN):
        try:
            decode({**obj, "op": str(obj["op"])}, sender)
        except MessageError:
            pass


def test_the_catalogue_in_the_architecture_page_is_the_records() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    begin, end = "<!-- catalogue: begin -->\n", "\n<!-- catalogue: end -->"
    assert begin in text and end in text
    documented = text.split(begin, 1)[1].split(end, 1)[0]
    assert documented == catalogue(), (
        "docs/architecture.md's message catalogue is out of date: replace the text between its catalogue markers with "
        "the output of: python -c 'from mpilaunch.protocol.messages import catalogue; print(catalogue())'"
    )


def test_every_down_message_is_handled_by_the_agent_and_every_up_one_by_the_controller(tmp_path) -> None:
    import socket

    from mpilaunch.cli.parse import parse_args
    from mpilaunch.launcher.output.sink import OutputSink
    from mpilaunch.launcher.start.here import ThisMachine
    from mpilaunch.plan.build import build_plan

    ours, theirs = socket.socketpair()
    agent = Agent(theirs)
    try:
        assert set(agent.handlers) == set(DOWN_MESSAGES)
    finally:
        agent.loop.close()
        ours.close()
        theirs.close()
    plan, _ = build_plan(parse_args(["-n", "1", "true"]), {"PATH": "/usr/bin:/bin"}, ThisMachine())
    controller = Controller(plan, OutputSink(None, None, False))
    try:
        assert set(controller.handlers) == set(UP_MESSAGES)
    finally:
        controller.sel.close()


def test_the_service_registry_says_what_each_service_handles() -> None:
    """The agent's dispatch table is built from the registry's rows before any service is
    imported: each row's messages are its class's `handles`."""
    from mpilaunch.agent.services.registry import REGISTRY, service_class

    for name, (_, handles) in REGISTRY.items():
        kind = service_class(name)
        assert kind.name == name and tuple(kind.handles) == handles, name
