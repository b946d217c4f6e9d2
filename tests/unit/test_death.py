"""agent/death.py: the parsers of /proc/PID/cgroup, mountinfo, the memory cgroup files, the
kernel log and core_pattern, the out-of-memory decision, and the agent's look at a dead rank
through its OS seam (the fake of test_agent_os: files, a kernel log and core files of the
test's own), down to the `exited` report and the failure summary's words."""

from __future__ import annotations

import signal

import pytest

from mpilaunch.agent.death import (
    Counts,
    KernelKill,
    Mount,
    cgroup_dir,
    cgroup_mounts,
    core_place,
    counts,
    host_memory,
    kernel_kills,
    limit_of,
    memory_cgroup,
    oom_judged,
)
from mpilaunch.launcher.report.json_report import death_fields
from mpilaunch.launcher.report.report_text import failure_summary, oom_words, size
from mpilaunch.protocol.messages import Death, Exited
from tests.fakeos import WALL, Agent

MIB = 1 << 20
V1_UNLIMITED = "9223372036854771712\n"

# This machine's (Linux 6.18, cgroup v1 memory controller, a v2 hierarchy without it).
PROC_CGROUP_V1 = """9:name=systemd:/
8:pids:/
4:memory:/process_api/7b2d
3:cpuset:/
1:cpu:/
0::/
"""
MOUNTINFO = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
KMSG_618 = [
    "4,520,9255210927,-;python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0\n",
    "6,598,9255211315,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
    "oom_memcg=/process_api/7b2d/mltry,task_memcg=/process_api/7b2d/mltry,task=python3,pid=27022,uid=0\n",
    "3,599,9255211331,-;Memory cgroup out of memory: Killed process 27022 (python3) total-vm:528572kB, "
    "anon-rss:109048kB, file-rss:6572kB, shmem-rss:0kB, UID:0 pgtables:276kB oom_score_adj:0\n",
]


# -- the parsers ---------------------------------------------------------------------------------------
def test_the_memory_cgroup_of_a_process() -> None:
    assert memory_cgroup(PROC_CGROUP_V1) == (1, "/process_api/7b2d")  # v1's memory hierarchy first
    assert memory_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") == (
        2,
        "/user.slice/user-1000.slice/session-3.scope",
    )
    assert memory_cgroup("5:cpu,memory:/job\n0::/\n") == (1, "/job")
    assert memory_cgroup("1:name=systemd:/x\n") is None
    assert memory_cgroup("") is None


def test_the_cgroup_mounts() -> None:
    assert cgroup_mounts(MOUNTINFO) == {
        1: Mount(1, "/", "/sys/fs/cgroup/memory"),
        2: Mount(2, "/", "/sys/fs/cgroup/unified"),
    }
    container = "1 0 0:1 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert cgroup_mounts(container) == {2: Mount(2, "/docker/abc", "/sys/fs/cgroup")}
    spaced = r"1 0 0:1 / /mnt/my\040cgroups rw - cgroup none rw,memory,cpu" + "\n"
    assert cgroup_mounts(spaced)[1].point == "/mnt/my cgroups"


def test_a_cgroup_path_on_disk() -> None:
    v1 = Mount(1, "/", "/sys/fs/cgroup/memory")
    assert cgroup_dir(v1, "/process_api/7b2d") == "/sys/fs/cgroup/memory/process_api/7b2d"
    assert cgroup_dir(v1, "/") == "/sys/fs/cgroup/memory"
    inner = Mount(2, "/docker/abc", "/sys/fs/cgroup")  # a container sees its own cgroup as the root
    assert cgroup_dir(inner, "/docker/abc/train") == "/sys/fs/cgroup/train"
    assert cgroup_dir(inner, "/docker/abc") == "/sys/fs/cgroup"
    assert cgroup_dir(inner, "/docker/abcd") is None and cgroup_dir(inner, "/other") is None


def test_the_counts_of_a_memory_cgroup() -> None:
    assert counts(1, "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", "36\n") == Counts(2, 36)
    assert counts(1, "oom_kill_disable 0\nunder_oom 0\n", "5\n") == Counts(None, 5)  # before Linux 4.13
    assert counts(2, "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n", None) == Counts(1, 12)
    assert counts(1, None, None) is None and counts(2, "", None) is None


def test_memory_limits_and_the_host_memory() -> None:
    assert limit_of("104857600\n") == 100 * MIB
    assert limit_of(V1_UNLIMITED) is None and limit_of("max\n") is None and limit_of(None) is None
    assert host_memory("MemTotal:       24683520 kB\nMemFree:  1 kB\n") == 24683520 * 1024
    assert host_memory("nothing\n") is None


def test_the_kernel_log_names_the_victims() -> None:
    assert kernel_kills(KMSG_618) == [KernelKill(27022, 9255.211331, True, "/process_api/7b2d/mltry")]
    older = [  # Linux 4.x: the choice, then the kill, with no oom-kill: line
        "3,10,500000000,-;Memory cgroup out of memory: Kill process 4242 (train) score 990 or sacrifice child\n",
        "3,11,500000100,-;Killed process 4242 (train) total-vm:1000kB, anon-rss:900kB, file-rss:0kB\n",
    ]
    assert kernel_kills(older) == [KernelKill(4242, 500.0, True, "")]
    host = ["3,12,600000000,-;Out of memory: Killed process 77 (python) total-vm:1kB, anon-rss:1kB\n"]
    assert kernel_kills(host) == [KernelKill(77, 600.0, False, "")]
    assert kernel_kills(["garbage", "6,1,x,-;Killed process 5", "6,2,3,-;Killed process abc (x)"]) == []


@pytest.mark.parametrize(
    ("named", "before", "after", "oom"),
    [
        (True, None, None, True),  # the kernel log names the pid
        (False, Counts(0, 0), Counts(1, 3), True),  # its cgroup's kill count rose
        (False, Counts(1, 3), Counts(1, 9), False),  # an earlier kill, not this one
        (False, None, Counts(1, 0), True),  # it moved into a cgroup unseen: any kill there
        (False, None, Counts(0, 0), False),
        (False, Counts(None, 3), Counts(None, 4), True),  # no oom_kill before 4.13: the limit was hit
        (False, None, Counts(None, 4), False),  # ... which says nothing without the count before
        (False, Counts(0, 0), None, False),  # its cgroup cannot be read
    ],
)
def test_the_oom_decision(named: bool, before: Counts | None, after: Counts | None, oom: bool) -> None:
    assert oom_judged(named, before, after) is oom


@pytest.mark.parametrize(
    ("pattern", "uses_pid", "place"),
    [
        ("core", False, ("file", "core")),
        ("core", True, ("file", "core.4242")),
        ("core.%p", True, ("file", "core.4242")),
        ("/var/crash/core.%e.%p.%t", False, ("file", "/var/crash/core.*.4242.*")),
        ("/cores/%h-%u-%g-%s-%%-%P", False, ("file", "/cores/node[[]1-1000-100-11-%-4242")),
        ("cores/core%", False, ("file", "cores/core")),
        (
            "|/lib/systemd/systemd-coredump %P %u %g %s %t 9223372036854775808 %h",
            False,
            ("pipe", "/lib/systemd/systemd-coredump"),
        ),
        (
            "|/usr/share/apport/apport -p%p -s%s -c%c -d%d -P%P -u%u -g%g -- %E",
            True,
            ("pipe", "/usr/share/apport/apport"),
        ),
    ],
)
def test_where_core_pattern_puts_a_core(pattern: str, uses_pid: bool, place: tuple[str, str]) -> None:
    assert core_place(pattern, uses_pid, pid=4242, sig=11, uid=1000, gid=100, host="node[1") == place


# -- the agent's look at a dead rank (through the fake OS) --------------------------------------------
JOB = "/sys/fs/cgroup/memory/job"
SIGKILLED = signal.SIGKILL  # a wait status: killed by SIGKILL, no core
DUMPED = signal.SIGSEGV | 0x80  # killed by SIGSEGV, core dumped


@pytest.fixture
def agent():  # type: ignore[no-untyped-def]
    made = Agent()
    made.os.files.update({
        "/proc/self/mountinfo": MOUNTINFO,
        "/proc/5000/cgroup": "4:memory:/job\n0::/\n",
        f"{JOB}/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
        f"{JOB}/memory.failcnt": "0\n",
        f"{JOB}/memory.limit_in_bytes": f"{100 * MIB}\n",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": V1_UNLIMITED,
        "/proc/meminfo": "MemTotal:       24683520 kB\n",
        "/proc/sys/kernel/core_pattern": "core\n",
        "/proc/sys/kernel/core_uses_pid": "0\n",
    })  # fmt: skip
    yield made
    made.close()


def ended(agent: Agent, status: int) -> Exited:
    agent.os.end(5000, status)
    agent.turns()
    (exited,) = [m for m in agent.sent if isinstance(m, Exited)]
    return exited


def oom_kill(agent: Agent, where: str = JOB, count: int = 1) -> None:
    agent.os.files[f"{where}/memory.oom_control"] = f"oom_kill_disable 0\nunder_oom 0\noom_kill {count}\n"


def test_a_sigkill_after_a_kill_in_its_cgroup_is_the_oom_killer(agent: Agent) -> None:
    """No kernel log to read: the count of its cgroup rose from 0 at its spawn; the limit is the
    smallest of its cgroup and those above."""
    agent.spawn(0)
    oom_kill(agent)
    death = ended(agent, SIGKILLED).death
    assert death == Death(oom=True, limit_bytes=100 * MIB, host_bytes=24683520 * 1024, peak_rss=2048 * 1024)
    assert death_fields(death) == {"oom": True, "limit_bytes": 100 * MIB, "peak_rss": 2 * MIB, "core": None}


def test_a_sigkill_the_agent_sent_is_not_looked_into(agent: Agent) -> None:
    agent.spawn(0)
    agent.reaper.kill_all(relayed_too=False)
    oom_kill(agent)
    assert ended(agent, SIGKILLED).death is None


def test_a_sigkill_with_no_kill_counted_says_nothing(agent: Agent) -> None:
    agent.spawn(0)
    agent.os.kmsg = []  # readable, and empty
    assert ended(agent, SIGKILLED).death is None


def test_an_exit_is_not_looked_into(agent: Agent) -> None:
    agent.spawn(0)
    oom_kill(agent)
    assert ended(agent, 137 << 8).death is None  # exit status 137: its own, whatever its child got


def test_the_kernel_log_names_the_rank_and_the_cgroup_it_moved_to(agent: Agent) -> None:
    """The rank moved itself to another cgroup and was killed before the agent looked again:
    the kernel log names its pid and that cgroup, whose limit is the one it hit."""
    agent.spawn(0)
    moved = "/sys/fs/cgroup/memory/process_api/7b2d/mltry"
    agent.os.files[f"{moved}/memory.limit_in_bytes"] = f"{64 * MIB}\n"
    agent.os.files["/sys/fs/cgroup/memory/process_api/7b2d/memory.limit_in_bytes"] = f"{200 * MIB}\n"
    agent.os.kmsg = [record.replace("27022", "5000").replace(",9255211", ",100211") for record in KMSG_618]
    agent.os.now = 100.5
    death = ended(agent, SIGKILLED).death
    assert death is not None and death.oom and death.limit_bytes == 64 * MIB


def test_a_kill_the_kernel_log_dates_before_the_rank_is_not_its(agent: Agent) -> None:
    """Its pid was someone else's when the kernel killed that one: the log says 5.2 s after boot,
    the rank started at 100 s."""
    agent.spawn(0)
    agent.os.kmsg = [record.replace("27022", "5000").replace(",9255211", ",5211") for record in KMSG_618]
    assert ended(agent, SIGKILLED).death is None


def test_the_host_running_out_of_memory_names_no_limit(agent: Agent) -> None:
    agent.spawn(0)
    agent.os.kmsg = ["3,12,100500000,-;Out of memory: Killed process 5000 (python) total-vm:1kB, anon-rss:1kB\n"]
    death = ended(agent, SIGKILLED).death
    assert death is not None and death.oom and death.limit_bytes is None and death.host_bytes == 24683520 * 1024


def test_a_move_seen_by_the_periodic_look_gives_the_count_before(agent: Agent) -> None:
    """The rank moved into a cgroup that had kills already (2); the look notices the move: a
    death with the count still 2 is not the OOM killer's, at 3 it is."""
    other = "/sys/fs/cgroup/memory/other"
    agent.spawn(0)
    agent.os.files["/proc/5000/cgroup"] = "4:memory:/other\n0::/\n"
    oom_kill(agent, other, 2)
    agent.os.now += 1.0
    agent.turns(1)
    assert agent.ranks.death.seen[5000].dir == other
    assert ended(agent, SIGKILLED).death is None


def test_a_move_seen_by_the_periodic_look_then_a_kill(agent: Agent) -> None:
    other = "/sys/fs/cgroup/memory/other"
    agent.spawn(0)
    agent.os.files["/proc/5000/cgroup"] = "4:memory:/other\n0::/\n"
    agent.os.files[f"{other}/memory.limit_in_bytes"] = f"{50 * MIB}\n"
    oom_kill(agent, other, 2)
    agent.os.now += 1.0
    agent.turns(1)
    oom_kill(agent, other, 3)
    death = ended(agent, SIGKILLED).death
    assert death is not None and death.oom and death.limit_bytes == 50 * MIB


def test_a_v2_zombie_shows_the_cgroup_it_died_in(agent: Agent) -> None:
    """cgroup v2 only: the rank moved unseen, its zombie still names the cgroup, which counts a kill."""
    agent.os.files["/proc/self/mountinfo"] = "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    agent.os.files["/proc/5000/cgroup"] = "0::/user.slice\n"
    agent.os.files["/sys/fs/cgroup/user.slice/memory.events"] = "max 0\noom_kill 0\n"
    agent.spawn(0)
    agent.os.zombies[5000] = "0::/user.slice/train\n"
    agent.os.files["/sys/fs/cgroup/user.slice/train/memory.events"] = "max 4\noom_kill 1\n"
    agent.os.files["/sys/fs/cgroup/user.slice/train/memory.max"] = f"{100 * MIB}\n"
    agent.os.files["/sys/fs/cgroup/user.slice/memory.max"] = "max\n"
    death = ended(agent, SIGKILLED).death
    assert death is not None and death.oom and death.limit_bytes == 100 * MIB


def test_a_core_file_is_found_where_core_pattern_puts_it(agent: Agent) -> None:
    agent.os.files["/proc/sys/kernel/core_pattern"] = "core.%e.%p\n"
    agent.spawn(0)
    agent.os.on_disk.update({
        "/core.python.5000": WALL + 100.2,  # the rank's working directory (the spec's) is /
        "/core.python.4999": WALL + 100.2,  # another pid's
    })  # fmt: skip
    death = ended(agent, DUMPED).death
    assert death == Death(peak_rss=2 * MIB, core="/core.python.5000")


def test_a_core_file_older_than_the_rank_is_not_its(agent: Agent) -> None:
    agent.spawn(0)
    agent.os.on_disk["/core"] = WALL + 10.0
    death = ended(agent, DUMPED).death
    assert death is not None and death.core is None and death.core_pattern == "core"


def test_a_core_piped_to_a_program_has_no_path(agent: Agent) -> None:
    agent.os.files["/proc/sys/kernel/core_pattern"] = "|/lib/systemd/systemd-coredump %P %u %g %s %t %c %h\n"
    agent.spawn(0)
    death = ended(agent, DUMPED).death
    assert death is not None and death.core is None and death.core_handler == "systemd-coredump"


def test_a_signal_without_a_core_says_nothing(agent: Agent) -> None:
    agent.spawn(0)
    agent.os.on_disk["/core"] = WALL + 100.2
    assert ended(agent, signal.SIGSEGV).death is None


# -- the summary's words -------------------------------------------------------------------------------
def test_the_summary_names_the_oom_killer_first_and_the_core_file() -> None:
    death = Death(oom=True, limit_bytes=100 * MIB, host_bytes=24 << 30, peak_rss=96 * MIB, core="/w/core.7")
    words = "killed by the out-of-memory killer (cgroup limit 100 MiB / host memory 24 GiB; peak RSS 96 MiB)"
    assert oom_words(death) == words
    text = failure_summary(
        rank=3, host="node2", pid=7, status=-9, argv=["python", "t.py"], last_lines=[], killed=[0, 1, 2],
        aborted=True, failed_total=1, death=death,
    )  # fmt: skip
    lines = text.splitlines()
    assert lines[1] == f"rank 3 on node2 was {words}"
    assert f"  Killed by: {words[len('killed by ') :]}" in lines
    assert "  Core file: /w/core.7" in lines
    assert "  Signal:    SIGKILL (9)" in lines


def test_the_summary_of_a_piped_core_and_of_a_lost_one() -> None:
    piped = failure_summary(
        rank=0, host="h", pid=42, status=-11, argv=["a.out"], last_lines=[], killed=[], aborted=True,
        failed_total=1, death=Death(core_handler="systemd-coredump"),
    )  # fmt: skip
    assert "  Core file: dumped to systemd-coredump, not to a file (coredumpctl info 42)" in piped.splitlines()
    assert "out-of-memory" not in piped
    lost = failure_summary(
        rank=0, host="h", pid=42, status=-11, argv=["a.out"], last_lines=[], killed=[], aborted=True,
        failed_total=1, death=Death(core_pattern="cores/core.%p"),
    )  # fmt: skip
    assert "  Core file: dumped, but not found where core_pattern (cores/core.%p) puts it" in lost.splitlines()


def test_sizes_for_people() -> None:
    assert [size(n) for n in (512, 100 * MIB, 113 * MIB + 900 * 1024, 24 << 30, 25275924480)] == [
        "512 B", "100 MiB", "113.9 MiB", "24 GiB", "23.5 GiB"
    ]  # fmt: skip
