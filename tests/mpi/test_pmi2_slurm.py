"""Slurm's PMI-2 client against the server: the `libpmi2.so.0` that Intel MPI loads with
`I_MPI_PMI=pmi2 I_MPI_PMI_LIBRARY=...`, driven by a small C program built here.

The `mpich` wheel has no PMI-2 (see test_pmi2.py), so this is the real PMI-2 client the suite
can run. It is the simple PMI-2 client MPICH shipped up to 4.0.1, and it reads some answers
under other keys than today's MPICH: `value` where MPICH reads `port` in `name-lookup-response`,
`isworld`/`msg` with no exit code in `abort` (it exits with the code itself). Debian packages it
as `libpmi2-0` and `libpmi2-0-dev`; the tests are skipped, saying so, where it is missing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Launcher

CLIENT_C = r"""
#include <stdio.h>
#include <string.h>
#include <slurm/pmi2.h>

/* A failed call is printed and ends the rank with status 2. */
#define CHECK(call) do { int rc_ = (call); if (rc_ != PMI2_SUCCESS) { \
    printf("rank %d: %s failed with %d\n", rank, #call, rc_); return 2; } } while (0)

int main(int argc, char **argv)
{
    int spawned = 0, size = 0, rank = -1, appnum = -1, flag = 0, len = 0;
    char jobid[256], key[PMI2_MAX_KEYLEN], value[PMI2_MAX_VALLEN], port[PMI2_MAX_VALLEN];
    const char *service = "mpilaunch-test-service";

    setvbuf(stdout, NULL, _IOLBF, 0);
    CHECK(PMI2_Init(&spawned, &size, &rank, &appnum));
    printf("rank %d init size=%d appnum=%d spawned=%d\n", rank, size, appnum, spawned);
    CHECK(PMI2_Job_GetId(jobid, sizeof jobid));
    printf("rank %d jobid=%s\n", rank, jobid);
    if (argc > 1 && strcmp(argv[1], "abort") == 0 && rank == size - 1)
        PMI2_Abort(7, "boom from the test client");  /* Slurm's client exits with 7 here */

    snprintf(key, sizeof key, "key-%d", rank);
    snprintf(value, sizeof value, "value;of;rank-%d", rank);
    CHECK(PMI2_KVS_Put(key, value));
    CHECK(PMI2_KVS_Fence());
    for (int r = 0; r < size; r++) {
        if (r == rank)
            continue;
        snprintf(key, sizeof key, "key-%d", r);
        CHECK(PMI2_KVS_Get(jobid, r, key, value, sizeof value, &len));
        printf("rank %d got %s=%s len=%d\n", rank, key, value, len);
    }
    CHECK(PMI2_Info_GetJobAttr("universeSize", value, sizeof value, &flag));
    printf("rank %d universeSize found=%d value=%s\n", rank, flag, flag ? value : "");
    if (rank == 0)
        CHECK(PMI2_Info_PutNodeAttr("node-key", "node;value"));
    CHECK(PMI2_Info_GetNodeAttr("node-key", value, sizeof value, &flag, 1));
    printf("rank %d node-key found=%d value=%s\n", rank, flag, flag ? value : "");

    snprintf(port, sizeof port, "tag#0$description#%s$port#4711$ifname#127.0.0.1$", jobid);
    if (rank == 0) {
        CHECK(PMI2_Nameserv_publish(service, NULL, port));
        printf("rank 0 published %s=%s\n", service, port);
    }
    CHECK(PMI2_KVS_Fence());
    CHECK(PMI2_Nameserv_lookup(service, NULL, value, sizeof value));
    printf("rank %d looked up %s=%s\n", rank, service, value);
    CHECK(PMI2_KVS_Fence());
    if (rank == 0) {
        CHECK(PMI2_Nameserv_unpublish(service, NULL));
        printf("rank 0 unpublished %s\n", service);
    }
    CHECK(PMI2_KVS_Fence());
    if (PMI2_Nameserv_lookup(service, NULL, value, sizeof value) != PMI2_SUCCESS)
        printf("rank %d lookup after unpublish failed\n", rank);
    CHECK(PMI2_Finalize());
    printf("rank %d finalized\n", rank);
    return 0;
}
"""

MISSING = "Slurm's PMI-2 client is not installed (Debian: apt-get install libpmi2-0 libpmi2-0-dev)"
SERVICE = "mpilaunch-test-service"
SLOTS = 4  # --host localhost:4: the universe size every rank must read


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The C client, linked with Slurm's libpmi2; skipped where gcc, pmi2.h or the library is missing."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc to build the PMI-2 test client")
    if not any(Path(d, "slurm", "pmi2.h").is_file() for d in ("/usr/include", "/usr/local/include")):
        pytest.skip(MISSING)
    directory = tmp_path_factory.mktemp("pmi2_slurm")
    source = directory / "client.c"
    source.write_text(CLIENT_C)
    binary = directory / "pmi2_client"
    built = subprocess.run([gcc, "-O1", "-Wall", "-o", str(binary), str(source), "-lpmi2"], capture_output=True)
    if built.returncode != 0 and b"-lpmi2" in built.stderr:
        pytest.skip(MISSING)
    assert built.returncode == 0, built.stderr.decode()
    return str(binary)


def expected_lines(size: int, jobid: str) -> list[str]:
    """What every rank of a good session prints: each other rank's key, one universe size, the
    node attribute, the port rank 0 published (byte for byte), and the lookup failing once it is gone."""
    port = f"tag#0$description#{jobid}$port#4711$ifname#127.0.0.1$"
    lines = [f"rank 0 published {SERVICE}={port}", f"rank 0 unpublished {SERVICE}"]
    for r in range(size):
        lines += [f"rank {r} init size={size} appnum=0 spawned=0", f"rank {r} jobid={jobid}"]
        lines += [f"rank {r} got key-{q}=value;of;rank-{q} len=15" for q in range(size) if q != r]
        lines += [f"rank {r} universeSize found=1 value={SLOTS}", f"rank {r} node-key found=1 value=node;value"]
        lines += [f"rank {r} looked up {SERVICE}={port}", f"rank {r} lookup after unpublish failed"]
        lines.append(f"rank {r} finalized")
    return sorted(lines)


@pytest.mark.parametrize("size", [1, 2, 4])
def test_slurm_pmi2_client_session(launcher: Launcher, client: str, size: int) -> None:
    """Init, KVS, job and node attributes, and the name service (publish, lookup by every rank,
    unpublish) through Slurm's own client, which reads `value` in the lookup's answer."""
    proc = launcher.run("--mpi", "pmi2", "--host", f"localhost:{SLOTS}", "-n", str(size), client, timeout=60)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, err + out
    jobids = set(re.findall(r"^rank \d+ jobid=(\S+)$", out, re.M))
    assert len(jobids) == 1, out
    (jobid,) = jobids
    assert jobid.startswith("kvs_")
    assert sorted(out.splitlines()) == expected_lines(size, jobid)
    assert err == ""


def test_slurm_pmi2_abort_ends_the_job_with_the_rank_s_code(launcher: Launcher, client: str) -> None:
    """Rank 1 calls PMI2_Abort(7) while rank 0 waits in a fence: Slurm's client sends no exit code
    and exits with 7 itself, so the job's status is 7 and the message is passed on."""
    start = time.monotonic()
    proc = launcher.run("--mpi", "pmi2", "--host", f"localhost:{SLOTS}", "-n", "2", client, "abort", timeout=60)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 7, err + out
    assert time.monotonic() - start < 10
    first = "mpilaunch: rank 1 called MPI_Abort: boom from the test client (its exit status is the code)"
    assert err.splitlines()[0] == first
    assert "Rank:      1" in err and "Exit code: 7" in err
    assert "rank 1 init size=2" in out and "finalized" not in out and "failed" not in out


def test_slurm_pmi2_client_over_pmi_tcp_is_refused_saying_why(launcher: Launcher, client: str) -> None:
    """Over --pmi-tcp the client opens with `cmd=init pmi_version=2` and no PMI_ID: still refused,
    in one line that names PMI-2 over TCP as the problem and the way out."""
    proc = launcher.run("--pmi-tcp", "-n", "1", client, timeout=60)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 2, err + out
    assert out.startswith("rank -1: PMI2_Init(")
    assert err.splitlines()[0] == (
        "mpilaunch: refused a PMI connection that did not present a valid PMI_ID: a PMI-2 client connected over "
        "--pmi-tcp, and PMI-2 does not send PMI_ID; drop --pmi-tcp to serve it over PMI_FD"
    )
