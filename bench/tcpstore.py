"""What mpilaunch's TCPStore server sustains on this machine, next to torch's own (libuv) server.

Run by hand:  python -m bench.tcpstore [--clients 2] [--seconds 3]
Each server runs in its own process on loopback; `--clients` processes load it with StoreClient
(the same client for both servers): new connections (connect, VALIDATE, PING, close), ADD
(a request and its answer, one at a time per client), SET (sent back to back, then one CHECK
to wait for them all), and 64 clients blocked in one WAIT released by one SET. Then the
server's resident memory: just started, with `--connections` connections open, and with
`--keys` keys of 100 bytes. Every loop is bounded in time or count; all traffic is on 127.0.0.1.
mpilaunch's server is the one `pip install` gives (bench/installed.py), run by that venv's Python.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

from bench.installed import clean_env
from mpilaunch.host.tcpstore import StoreClient  # the load: one client for both servers

TORCH_SERVER = """
import sys, time, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
print(store.port, flush=True)
sys.stdin.read()
"""


def servers() -> dict[str, list[str]]:
    from bench.installed import installed

    return {
        "mpilaunch": [str(installed() / "python"), "-m", "mpilaunch.host.tcpstore", "--host", "127.0.0.1"],
        "torch (libuv)": [sys.executable, "-c", TORCH_SERVER],
    }


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def connections(port: int, seconds: float, _: int) -> int:
    done, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        StoreClient("127.0.0.1", port, 10).close()
        done += 1
    return done


def adds(port: int, seconds: float, index: int) -> int:
    done, end = 0, time.monotonic() + seconds
    with StoreClient("127.0.0.1", port, 10) as client:
        while time.monotonic() < end:
            for _ in range(100):
                client.add(f"counter/{index}", 1)
            done += 100
    return done


def sets(port: int, seconds: float, index: int) -> int:
    done, end = 0, time.monotonic() + seconds
    value = b"x" * 100
    with StoreClient("127.0.0.1", port, 60) as client:
        while time.monotonic() < end:
            for number in range(1000):
                client.set(f"set/{index}/{number}", value)
            client.check([f"set/{index}/999"])  # answered once the 1000 before it are
            done += 1000
    return done


def rate(task, port: int, clients: int, seconds: float) -> float:  # type: ignore[no-untyped-def]
    with multiprocessing.Pool(clients) as pool:
        start = time.perf_counter()
        counts = pool.starmap(task, [(port, seconds, index) for index in range(clients)])
        return sum(counts) / (time.perf_counter() - start)


def release_many(port: int, waiters: int) -> float:
    """Seconds from one SET to the last of `waiters` blocked clients seeing its answer."""
    import selectors

    clients = [StoreClient("127.0.0.1", port, 60) for _ in range(waiters)]
    for client in clients:
        client.wait_begin(["go"])
    with StoreClient("127.0.0.1", port, 60) as setter:
        setter.check(["go"])  # the waits reached the server before this was answered
        time.sleep(0.2)
        with selectors.DefaultSelector() as sel:
            for client in clients:
                sel.register(client, selectors.EVENT_READ)
            start = time.perf_counter()
            setter.set("go", b"1")
            left = len(clients)
            while left:
                for key, _ in sel.select(10):
                    sel.unregister(key.fileobj)
                    left -= 1
            took = time.perf_counter() - start
    for client in clients:
        client.wait_end(10)
        client.close()
    return took


def memory(proc: subprocess.Popen, port: int, open_count: int, keys: int) -> tuple[int, int, int]:
    idle = rss_kib(proc.pid)
    held = [StoreClient("127.0.0.1", port, 60) for _ in range(open_count)]
    held[-1].num_keys()  # every connection before it is served
    with_connections = rss_kib(proc.pid)
    for client in held:
        client.close()
    with StoreClient("127.0.0.1", port, 60) as client:
        value = b"v" * 100
        for number in range(keys):
            client.set(f"key/{number:08d}", value)
        assert client.num_keys() >= keys
    return idle, with_connections, rss_kib(proc.pid)


def measure(argv: list[str], env: dict[str, str], args: argparse.Namespace) -> dict[str, float]:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())  # type: ignore[union-attr]
        found = {
            "connections/s": rate(connections, port, args.clients, args.seconds),
            "ADD/s": rate(adds, port, args.clients, args.seconds),
            "SET/s": rate(sets, port, args.clients, args.seconds),
            "ms from one SET to 64 waiters released": release_many(port, 64) * 1000,
        }
        idle, held, filled = memory(proc, port, args.connections, args.keys)
        found["MiB resident, started"] = idle / 1024
        found[f"MiB resident, {args.connections} connections open"] = held / 1024
        found[f"MiB resident, {args.keys} keys of 100 bytes"] = filled / 1024
        return found
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3, help="each server measured this often, in turn")
    args = parser.parse_args()
    env = clean_env()
    found = servers()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in found}
    for _ in range(args.rounds):
        for name, argv in found.items():
            runs[name].append(measure(argv, env, args))
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {args.clients} client processes,")
    print(f"{args.seconds:g} s a rate; median (min-max) of {args.rounds} rounds")
    print(f"{'':42}" + "".join(f"{name:>26}" for name in found))
    for metric in runs[next(iter(found))][0]:
        cells = []
        for name in found:
            values = sorted(run[metric] for run in runs[name])
            cells.append(f"{number(statistics.median(values))} ({number(values[0])}-{number(values[-1])})")
        print(f"{metric:42}" + "".join(f"{cell:>26}" for cell in cells))


def number(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


if __name__ == "__main__":
    main()
