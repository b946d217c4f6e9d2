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
import struct

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
STOP_LIMIT = 5.0  # seconds the server gets to deregister its namespaces and finalize
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
    """An array of pmix_info_t built from (key, type, value) rows, laid out with everything it
    points to (strings, procs, nested arrays) in one buffer that lives as long as the list. A
    job's rows hold an array per rank: as one buffer they are one allocation, handed back whole
    when the list goes, not thousands of small ctypes objects that leave the heap fragmented."""

    def __init__(self, rows: list[tuple[str, int, object]]) -> None:
        infos, arrays, procs, text = _measure(rows)
        self.count = len(rows)
        infos = max(1, infos)
        self.buffer = bytearray(infos * _INFO + arrays * _DARRAY + procs * _PROC + text)
        base = ctypes.addressof((ctypes.c_char * len(self.buffer)).from_buffer(self.buffer))
        self.array = (Info * infos).from_buffer(self.buffer)
        self._base = base
        # The next free Info, DataArray, Proc and string byte, as offsets in the buffer.
        first_array = infos * _INFO
        first_proc = first_array + arrays * _DARRAY
        self._free = [len(rows) * _INFO, first_array, first_proc, first_proc + procs * _PROC]
        self._fill(rows, 0)

    def _fill(self, rows: list[tuple[str, int, object]], at: int) -> None:
        """Write rows as Info structures from offset `at` (their slots taken already)."""
        buffer, free = self.buffer, self._free
        for key, kind, value in rows:
            _HEAD.pack_into(buffer, at, key.encode(), 0, kind)
            data = at + _DATA
            if kind == BOOL:
                _BOOL.pack_into(buffer, data, bool(value))
            elif kind == STRING:
                _POINTER.pack_into(buffer, data, self._string(str(value).encode()))
            elif kind == UINT16:
                _UINT16.pack_into(buffer, data, int(value))  # type: ignore[call-overload]
            elif kind in (UINT32, PROC_RANK):
                _UINT32.pack_into(buffer, data, int(value))  # type: ignore[call-overload]
            elif kind == PROC:  # value: (nspace, rank)
                nspace, rank = value  # type: ignore[misc]
                where = free[2]
                free[2] += _PROC
                _PROC_LAYOUT.pack_into(buffer, where, nspace.encode()[:255], rank)
                _POINTER.pack_into(buffer, data, self._base + where)
            elif kind == DATA_ARRAY:  # value: a list of (key, type, value) rows, as an info array
                inner: list[tuple[str, int, object]] = value  # type: ignore[assignment]
                first = free[0]
                free[0] += len(inner) * _INFO
                where = free[1]
                free[1] += _DARRAY
                _DARRAY_LAYOUT.pack_into(buffer, where, INFO, len(inner), self._base + first)
                _POINTER.pack_into(buffer, data, self._base + where)
                self._fill(inner, first)
            else:
                raise ValueError(f"PMIx data type {kind} is not built here")
            at += _INFO

    def _string(self, text: bytes) -> int:
        where = self._free[3]
        self.buffer[where : where + len(text)] = text  # the byte after it is a zero already
        self._free[3] += len(text) + 1
        return self._base + where


def _measure(rows: list[tuple[str, int, object]]) -> tuple[int, int, int, int]:
    """(Info structures, DataArrays, Procs, string bytes) that rows need, nested arrays included."""
    infos, arrays, procs, text = len(rows), 0, 0, 0
    for _key, kind, value in rows:
        if kind == STRING:
            text += len(str(value).encode()) + 1
        elif kind == PROC:
            procs += 1
        elif kind == DATA_ARRAY:
            inner = _measure(value)  # type: ignore[arg-type]
            infos, arrays, procs, text = infos + inner[0], arrays + 1 + inner[1], procs + inner[2], text + inner[3]
    return infos, arrays, procs, text


# Where InfoList writes: the layouts of pmix_info_t's head (key, flags, value.type), its value's
# data, pmix_data_array_t and pmix_proc_t, from the ctypes structures above.
_INFO, _DARRAY, _PROC = ctypes.sizeof(Info), ctypes.sizeof(DataArray), ctypes.sizeof(Proc)
_DATA = Info.value.offset + Value.data.offset
_HEAD = struct.Struct(f"={Info.key.size}sI{Info.value.offset - Info.flags.offset - 4}xH")
_WORD = {4: "I", 8: "Q"}[ctypes.sizeof(ctypes.c_void_p)]  # a pointer, a size_t
_BOOL, _UINT16, _UINT32, _POINTER = (struct.Struct(f"={code}") for code in ("?", "H", "I", _WORD))
_DARRAY_LAYOUT = struct.Struct(f"=H{DataArray.size.offset - 2}x{_WORD}{_WORD}")
_PROC_LAYOUT = struct.Struct(f"={Proc.nspace.size}sI")


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
        self.unanswered = OP_CB(lambda status, cbdata: None)  # for calls not waited for

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
        """Not waited for: given no callback, PMIx would hold the agent's loop until its own
        thread had done it, and a rank killed while it connects can leave that thread unable to."""
        self.keep.append(who)  # PMIx's thread may read it after this returns
        self.lib.PMIx_server_deregister_client(ctypes.byref(who), self.unanswered, None)

    def setup_fork(self, who: Proc) -> dict[str, str]:
        """The variables a rank needs to reach this server."""
        env = ctypes.POINTER(ctypes.c_char_p)()
        status = self.lib.PMIx_server_setup_fork(ctypes.byref(who), ctypes.byref(env))
        if status != SUCCESS:
            raise LibraryError(f"PMIx_server_setup_fork failed with status {status}")
        return dict(line.partition("=")[::2] for line in strings(env))

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

    def stop(self, nspaces: list[str], limit: float = STOP_LIMIT) -> bool:
        """Deregister these namespaces and finalize, waiting limit seconds at most (each call
        waits for PMIx's thread; one that never answers must not keep the agent, and its ranks'
        exits, from ending). True if the server stopped in time."""
        import threading

        def stopping() -> None:
            for nspace in nspaces:
                self.deregister_nspace(nspace)
            self.finalize()

        worker = threading.Thread(target=stopping, name="pmix-stop", daemon=True)
        try:
            worker.start()
        except RuntimeError:  # no thread to be had (`ulimit -u` counts threads): the agent leaves without
            return False  # PMIx's goodbye, as when it does not answer; its folder is removed all the same
        worker.join(limit)
        return not worker.is_alive()

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
