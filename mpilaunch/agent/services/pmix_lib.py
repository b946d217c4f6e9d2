"""The PMIx server library (`libpmix.so.2`, PMIx 4 or 5) through ctypes: the structures, the
calls an agent makes, and the upcalls it takes.

Only what a host's server needs (openpmix's `pmix_common.h` and `pmix_server.h`, v4.2 and
v5.0, which agree on all of it): the sizes are checked when the library is loaded and a
library that disagrees is refused. Upcalls arrive on PMIx's progress thread; the service only
copies what they pass and wakes the agent's loop (see services/pmix.py), and every buffer
handed to the library stays referenced until the library releases it.
"""

from __future__ import annotations

import ctypes
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

# Data types and status codes (pmix_common.h)
BOOL, BYTE, STRING, INT, INT32, UINT8, UINT16, UINT32 = 1, 2, 3, 6, 9, 12, 13, 14
STATUS, PROC, INFO, BYTE_OBJECT, PERSIST, DATA_RANGE, DATA_ARRAY, PROC_RANK = 20, 22, 24, 27, 30, 33, 39, 40
SUCCESS, ERROR, ERR_NOT_SUPPORTED, OPERATION_SUCCEEDED = 0, -1, -47, -157
ERR_TIMEOUT, ERR_BAD_PARAM, ERR_OUT_OF_RESOURCE, ERR_NOT_FOUND = -24, -27, -29, -46
ERR_JOB_FAILED_TO_LAUNCH = -181
PERSIST_FIRST_READ = 1  # pmix_persistence_t: the datum is gone once looked up
RANK_WILDCARD = 0xFFFFFFFE
MODULE_SLOTS = 40  # 28 in PMIx 4.2, 29 in 5.0: a zero-filled table longer than either
# Slots of pmix_server_module_t
CLIENT_CONNECTED, CLIENT_FINALIZED, ABORT, FENCE_NB, DIRECT_MODEX, JOB_CONTROL = 0, 1, 2, 3, 4, 19
PUBLISH, LOOKUP, UNPUBLISH, SPAWN, CONNECT, DISCONNECT = 5, 6, 7, 8, 9, 10


class Proc(ctypes.Structure):
    _fields_ = (("nspace", ctypes.c_char * 256), ("rank", ctypes.c_uint32))


class DataArray(ctypes.Structure):
    _fields_ = (("type", ctypes.c_uint16), ("size", ctypes.c_size_t), ("array", ctypes.c_void_p))


class ByteObject(ctypes.Structure):
    _fields_ = (("bytes", ctypes.c_void_p), ("size", ctypes.c_size_t))


class _Union(ctypes.Union):
    _fields_ = (
        ("flag", ctypes.c_bool),
        ("string", ctypes.c_char_p),
        ("uint8", ctypes.c_uint8),  # also pmix_persistence_t, pmix_data_range_t
        ("uint16", ctypes.c_uint16),
        ("int32", ctypes.c_int32),  # also int, pmix_status_t
        ("uint32", ctypes.c_uint32),
        ("proc", ctypes.POINTER(Proc)),
        ("bo", ByteObject),
        ("darray", ctypes.POINTER(DataArray)),
        ("raw", ctypes.c_byte * 24),  # the largest member (pmix_envar_t)
    )


class Value(ctypes.Structure):
    _fields_ = (("type", ctypes.c_uint16), ("data", _Union))


class Info(ctypes.Structure):
    _fields_ = (("key", ctypes.c_char * 512), ("flags", ctypes.c_uint32), ("value", Value))


class App(ctypes.Structure):
    """pmix_app_t: one program of a PMIx_Spawn."""

    _fields_ = (
        ("cmd", ctypes.c_char_p),
        ("argv", ctypes.POINTER(ctypes.c_char_p)),  # NULL-terminated
        ("env", ctypes.POINTER(ctypes.c_char_p)),  # NULL-terminated NAME=VALUE
        ("cwd", ctypes.c_char_p),
        ("maxprocs", ctypes.c_int),
        ("info", ctypes.POINTER(Info)),
        ("ninfo", ctypes.c_size_t),
    )


class PData(ctypes.Structure):
    """pmix_pdata_t: one published datum, as a lookup returns it."""

    _fields_ = (("proc", Proc), ("key", ctypes.c_char * 512), ("value", Value))


SIZES = {Proc: 260, Value: 32, Info: 552, App: 56, PData: 808, ByteObject: 16}

OP_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p)
RELEASE_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
MODEX_CB = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, RELEASE_CB, ctypes.c_void_p
)
DMODEX_RESPONSE = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_P = ctypes.c_void_p
CLIENT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Proc), _P, _P, _P)
ABORT_FN = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(Proc), _P, ctypes.c_int, ctypes.c_char_p, _P, ctypes.c_size_t, _P, _P
)
FENCE_FN = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(Proc), ctypes.c_size_t, _P, ctypes.c_size_t, _P, ctypes.c_size_t, MODEX_CB, _P
)
DMODEX_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Proc), _P, ctypes.c_size_t, MODEX_CB, _P)
JOB_CONTROL_FN = ctypes.CFUNCTYPE(ctypes.c_int, _P, _P, ctypes.c_size_t, _P, ctypes.c_size_t, _P, _P)
SPAWN_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, _P)  # (status, nspace, cbdata)
LOOKUP_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, _P, ctypes.c_size_t, _P)  # (status, pmix_pdata_t[], n, cbdata)
SPAWN_FN = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(Proc), _P, ctypes.c_size_t, ctypes.POINTER(App), ctypes.c_size_t, SPAWN_CB, _P
)
PROCS_FN = ctypes.CFUNCTYPE(  # connect and disconnect: (procs, nprocs, info, ninfo, cbfunc, cbdata)
    ctypes.c_int, ctypes.POINTER(Proc), ctypes.c_size_t, _P, ctypes.c_size_t, OP_CB, _P
)
PUBLISH_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Proc), _P, ctypes.c_size_t, OP_CB, _P)
KEYS = ctypes.POINTER(ctypes.c_char_p)  # a NULL-terminated array of strings
LOOKUP_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Proc), KEYS, _P, ctypes.c_size_t, LOOKUP_CB, _P)
UNPUBLISH_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Proc), KEYS, _P, ctypes.c_size_t, OP_CB, _P)


class LibraryError(Exception):
    """A PMIx library that cannot serve (missing, too old, another ABI)."""


def proc(nspace: str, rank: int) -> Proc:
    return Proc(nspace.encode()[:255], rank)


def strings(array: object) -> list[str]:
    """A NULL-terminated char** as Python strings (an empty list for NULL)."""
    out: list[str] = []
    index = 0
    while array and array[index]:  # type: ignore[index]
        out.append(array[index].decode(errors="surrogateescape"))  # type: ignore[index]
        index += 1
    return out


def value_of(value: Value) -> object:
    """The Python value of a pmix_value_t of the types read here, else None."""
    kind = value.type
    if kind == STRING:
        return (value.data.string or b"").decode(errors="surrogateescape")
    if kind == BOOL:
        return bool(value.data.flag)
    if kind in (BYTE, UINT8, PERSIST, DATA_RANGE):
        return int(value.data.uint8)
    if kind == UINT16:
        return int(value.data.uint16)
    if kind in (INT, INT32, STATUS):
        return int(value.data.int32)
    if kind in (UINT32, PROC_RANK):
        return int(value.data.uint32)
    if kind == BYTE_OBJECT:
        bo = value.data.bo
        return ctypes.string_at(bo.bytes, bo.size) if bo.bytes and bo.size else b""
    if kind == PROC and value.data.proc:
        return (value.data.proc.contents.nspace.decode(errors="replace"), int(value.data.proc.contents.rank))
    return None


def infos(array: object, count: int) -> list[tuple[str, int, object]]:
    """A pmix_info_t array as (key, type, value) rows; value None for a type not read here."""
    if not array or not count:
        return []
    rows = ctypes.cast(array, ctypes.POINTER(Info))
    return [
        (rows[i].key.decode(errors="replace"), int(rows[i].value.type), value_of(rows[i].value)) for i in range(count)
    ]


class InfoList:
    """An array of pmix_info_t built from (key, type, value) rows, with everything it points to
    kept alive as long as the list is."""

    def __init__(self, rows: list[tuple[str, int, object]]) -> None:
        self.keep: list[object] = []
        self.array = (Info * max(1, len(rows)))()
        self.count = len(rows)
        for slot, (key, kind, value) in zip(self.array, rows):
            slot.key = key.encode()
            self._set(slot.value, kind, value)

    def _set(self, target: Value, kind: int, value: object) -> None:
        target.type = kind
        if kind == BOOL:
            target.data.flag = bool(value)
        elif kind == STRING:
            encoded = ctypes.create_string_buffer(str(value).encode())
            self.keep.append(encoded)
            target.data.string = ctypes.cast(encoded, ctypes.c_char_p)
        elif kind == UINT16:
            target.data.uint16 = int(value)  # type: ignore[call-overload]
        elif kind in (UINT32, PROC_RANK):
            target.data.uint32 = int(value)  # type: ignore[call-overload]
        elif kind == PROC:  # value: (nspace, rank)
            who = proc(*value)  # type: ignore[misc]
            self.keep.append(who)
            target.data.proc = ctypes.pointer(who)
        elif kind == DATA_ARRAY:  # value: a list of (key, type, value) rows, as an info array
            inner = InfoList(value)  # type: ignore[arg-type]
            self.keep.append(inner)
            darray = DataArray(INFO, inner.count, ctypes.cast(inner.array, ctypes.c_void_p))
            self.keep.append(darray)
            target.data.darray = ctypes.pointer(darray)
        else:
            raise ValueError(f"PMIx data type {kind} is not built here")


class Server:
    """One PMIx server per agent: init, namespaces, clients, and the answers to upcalls."""

    def __init__(self, path: str) -> None:
        try:
            self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise LibraryError(f"cannot load {path}: {exc}") from None
        for kind, size in SIZES.items():
            if ctypes.sizeof(kind) != size:
                raise LibraryError(f"this Python lays out {kind.__name__} in {ctypes.sizeof(kind)} bytes, not {size}")
        lib = self.lib
        try:
            version = lib.PMIx_Get_version
        except AttributeError:
            raise LibraryError(f"{path} is not a PMIx library") from None
        version.restype = ctypes.c_char_p
        self.version = version().decode(errors="replace")
        major = next((int(word.split(".")[0]) for word in self.version.split() if word[:1].isdigit()), 0)
        if major < 4:
            raise LibraryError(f"{path} is PMIx {self.version}: serving needs PMIx 4 or 5")
        lib.PMIx_server_init.argtypes = (_P, _P, ctypes.c_size_t)
        lib.PMIx_server_finalize.argtypes = ()
        lib.PMIx_server_register_nspace.argtypes = (ctypes.c_char_p, ctypes.c_int, _P, ctypes.c_size_t, _P, _P)
        lib.PMIx_server_deregister_nspace.argtypes = (ctypes.c_char_p, _P, _P)
        lib.PMIx_server_deregister_nspace.restype = None
        lib.PMIx_server_register_client.argtypes = (ctypes.POINTER(Proc), ctypes.c_uint, ctypes.c_uint, _P, _P, _P)
        lib.PMIx_server_deregister_client.argtypes = (ctypes.POINTER(Proc), _P, _P)
        lib.PMIx_server_deregister_client.restype = None
        lib.PMIx_server_setup_fork.argtypes = (ctypes.POINTER(Proc), ctypes.POINTER(ctypes.POINTER(ctypes.c_char_p)))
        lib.PMIx_server_dmodex_request.argtypes = (ctypes.POINTER(Proc), DMODEX_RESPONSE, _P)
        self.module = (ctypes.c_void_p * MODULE_SLOTS)()
        self.keep: list[object] = []  # callbacks and buffers the library may still use

    def start(self, rows: list[tuple[str, int, object]], upcalls: dict[int, object]) -> None:
        for slot, function in upcalls.items():
            self.keep.append(function)
            self.module[slot] = ctypes.cast(function, ctypes.c_void_p)
        info = InfoList(rows)
        self.keep.append(info)
        status = self.lib.PMIx_server_init(self.module, info.array, info.count)
        if status != SUCCESS:
            raise LibraryError(f"PMIx_server_init failed with status {status}")

    def register_nspace(self, nspace: str, local: int, rows: list[tuple[str, int, object]]) -> None:
        info = InfoList(rows)
        self._blocking(
            lambda cb: self.lib.PMIx_server_register_nspace(nspace.encode(), local, info.array, info.count, cb, None)
        )

    def deregister_nspace(self, nspace: str) -> None:
        self.lib.PMIx_server_deregister_nspace(nspace.encode(), None, None)

    def register_client(self, who: Proc) -> None:
        self._blocking(
            lambda cb: self.lib.PMIx_server_register_client(ctypes.byref(who), os.getuid(), os.getgid(), None, cb, None)
        )

    def deregister_client(self, who: Proc) -> None:
        self.lib.PMIx_server_deregister_client(ctypes.byref(who), None, None)

    def setup_fork(self, who: Proc) -> dict[str, str]:
        """The variables a rank needs to reach this server."""
        env = ctypes.POINTER(ctypes.c_char_p)()
        status = self.lib.PMIx_server_setup_fork(ctypes.byref(who), ctypes.byref(env))
        if status != SUCCESS:
            raise LibraryError(f"PMIx_server_setup_fork failed with status {status}")
        found: dict[str, str] = {}
        index = 0
        while env and env[index]:
            name, _, value = env[index].decode(errors="surrogateescape").partition("=")
            found[name] = value
            index += 1
        return found

    def dmodex_request(self, who: Proc, answer: Callable[[int, bytes], None]) -> None:
        """Ask this server for a local rank's data (it answers once the rank has committed it),
        on PMIx's thread: answer(status, data)."""

        def done(status: int, data: int, size: int, cbdata: object) -> None:
            answer(status, ctypes.string_at(data, size) if data and size else b"")

        callback = DMODEX_RESPONSE(done)
        self.keep.append(callback)  # lives as long as the server: a late answer never calls freed code
        status = self.lib.PMIx_server_dmodex_request(ctypes.byref(who), callback, None)
        if status != SUCCESS:
            answer(status, b"")

    def finalize(self) -> None:
        self.lib.PMIx_server_finalize()

    def _blocking(self, call: Callable[[object], int]) -> None:
        """A non-blocking PMIx call made and waited for (the answer comes on PMIx's thread)."""
        import threading

        done = threading.Event()
        result: list[int] = []

        def finished(status: int, cbdata: object) -> None:
            result.append(status)
            done.set()

        callback = OP_CB(finished)
        status = call(callback)
        if status == OPERATION_SUCCEEDED:
            return
        if status != SUCCESS:
            raise LibraryError(f"PMIx call failed with status {status}")
        if not done.wait(30) or result[0] != SUCCESS:
            raise LibraryError(f"PMIx call ended with status {result[0] if result else 'none (timed out)'}")
