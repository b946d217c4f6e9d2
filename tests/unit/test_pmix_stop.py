"""The agent's PMIx server stops within a bound (agent/services/pmix_lib.Server.stop): each of
PMIx's teardown calls waits for PMIx's own thread, and one that never answers must not keep the
agent from ending. The library is stood in for by an object with the same three functions."""

from __future__ import annotations

import threading
import time

from mpilaunch.agent.services.pmix_lib import Server


class Library:
    """PMIx_server_deregister_nspace and PMIx_server_finalize, recorded; finalize waits until
    released (a PMIx whose thread never answers, when never released)."""

    def __init__(self, answers: bool) -> None:
        self.calls: list[str] = []
        self.release = threading.Event()
        if answers:
            self.release.set()

    def PMIx_server_deregister_nspace(self, nspace: bytes, cbfunc: object, cbdata: object) -> None:
        self.calls.append(f"deregister {nspace.decode()}")

    def PMIx_server_finalize(self) -> int:
        self.calls.append("finalize")
        self.release.wait()
        return 0


def server_with(library: Library) -> Server:
    server = Server.__new__(Server)  # the library stood in for: no PMIx loaded
    server.lib = library
    return server


def test_a_server_that_answers_stops_in_order() -> None:
    library = Library(answers=True)
    assert server_with(library).stop(["mpilaunch.1", "mpilaunch.2"], limit=5.0)
    assert library.calls == ["deregister mpilaunch.1", "deregister mpilaunch.2", "finalize"]


def test_a_server_that_never_answers_is_left_at_the_limit() -> None:
    library = Library(answers=False)
    started = time.monotonic()
    assert not server_with(library).stop(["mpilaunch.1"], limit=0.3)
    waited = time.monotonic() - started
    assert 0.3 <= waited < 2.0, waited
    assert library.calls == ["deregister mpilaunch.1", "finalize"]
    library.release.set()  # the stopping thread ends with the test
