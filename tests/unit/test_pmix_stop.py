"""The agent's PMIx server stops within a bound (agent/services/pmix_lib.Server.stop): each of
PMIx's teardown calls waits for PMIx's own thread, and one that never answers must not keep the
agent from ending. The library is stood in for by an object with the same three functions."""

from __future__ import annotations

import os
import tempfile
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


def test_with_no_thread_to_be_had_it_leaves_without_the_teardown(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`ulimit -u` counts threads: a Thread that cannot start is a server not stopped in time,
    not an exception that ends the agent before it removes its folders."""

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    library = Library(answers=True)
    assert server_with(library).stop(["mpilaunch.1"], limit=5.0) is False
    assert library.calls == []


def test_a_server_that_cannot_start_leaves_no_folder(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """PMIx_server_init failed (no thread for its progress thread under `ulimit -u`): the folder
    made for it goes at once. Before, it stayed until the agent's end, and an agent that did
    not end well left it to a guardian that could not fork either."""
    from mpilaunch.agent.services import pmix_start

    class Failing:
        def __init__(self, path: str) -> None:
            pass

        def start(self, info: object, upcalls: object) -> None:
            raise pmix_start.lib.LibraryError("PMIx_server_init failed with status -1")

    class Topology:
        def before(self) -> None:
            pass

        def after(self) -> None:
            pass

    monkeypatch.setattr(pmix_start.lib, "Server", Failing)
    monkeypatch.setattr(pmix_start, "CachedTopology", Topology)
    made: list[str] = []
    monkeypatch.setattr(pmix_start, "make_folder", lambda prefix: made.append(_folder(prefix)) or made[-1])
    starter = pmix_start.ServerStart(dict)
    try:
        starter.start("libpmix.so.2")
    except pmix_start.lib.LibraryError:
        pass
    else:
        raise AssertionError("the failing start did not say so")
    assert made and not os.path.exists(made[0]) and starter.dir is None


def _folder(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix)
