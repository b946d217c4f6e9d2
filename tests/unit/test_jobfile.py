"""Job files (--config job.yaml): keys from the command's options, types, errors naming the line,
merging under the command line, and fuzzing (through the command: tests/local/test_dry_runs.py)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpilaunch.cli.command import run_command
from mpilaunch.cli.jobfile import FileApp, option_keys, parse_job_file
from mpilaunch.cli.parse import parse_args
from mpilaunch.errors import LaunchError
from mpilaunch.plan.spec import AppContext

PARAMS = run_command().params


def parse(text: str, path: str = "job.yaml"):
    return parse_job_file(text, path, PARAMS)


def spec_of(tmp_path: Path, text: str, *args: str):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return parse_args(["--config", str(path), *args])


# ---- keys ----------------------------------------------------------------------------------------


def test_keys_are_the_long_option_names() -> None:
    keys = option_keys(PARAMS)
    for key in (
        "np", "host", "hostfile", "machinefile", "map_by", "npernode", "oversubscribe", "display_map",
        "dry_run", "x", "wdir", "wd", "output_filename", "merge_stderr_to_stdout", "tag_output",
        "timestamp_output", "stdin", "mca", "bind_to", "report_bindings", "timeout", "kill_timeout",
        "mpi", "pmi_tcp", "ssh_config", "ssh_accept_new", "allow_run_as_root",
    ):  # fmt: skip
        assert key in keys, key
    for absent in ("config", "version", "argv", "help", "n", "c", "H", "f"):
        assert absent not in keys


def test_every_option_of_the_command_has_a_key() -> None:
    """The keys come from the click parameters: a new option is a new key, with its type (but not
    hydra's spellings of what a job file says with x: and env:, nor another file)."""
    covered = {param.name for param in option_keys(PARAMS).values()}
    options = {p.name for p in PARAMS if isinstance(p, click.Option) and p.expose_value}
    hydra = {"configfile", "genv", "genvlist", "genvnone", "app_env", "app_envlist", "iface"}
    hydra |= {"hydra_hosts", "hydra_hostfile", "ppn", "rsh_agent", "rsh_args", "outfile_pattern", "errfile_pattern"}
    hydra |= {"print_rank_map", "gpus_per_proc", "rmk", "binding", "demux"}
    assert options - covered == {"config", "appfile", "am", "tune", *hydra}


# ---- values --------------------------------------------------------------------------------------

FULL = """\
# every kind of value
np: 16
host: [DEVICE1:8, "192.168.0.1:8"]
map_by: node
oversubscribe: yes
output_filename: log_output
merge_stderr_to_stdout: true
timeout: 90
kill_timeout: 0.5
stdin: none
bind_to: none
mca:
  orte_abort_on_non_zero_status: 0
  btl_tcp_if_include: eth0
x: [OMP_NUM_THREADS=4, HOME]
env:
  DATA_PATH: ./MNIST_Data/train/
  LR: 0.10
  DEBUG: yes
  PATH:
mpi: PMI2
command: [python, net.py, --epochs, 010]
"""


def test_a_full_job_file() -> None:
    job = parse(FULL)
    assert job.options == {
        "hosts": ("DEVICE1:8", "192.168.0.1:8"),
        "map_by": "node",
        "oversubscribe": True,
        "output_filename": "log_output",
        "merge_stderr_to_stdout": True,
        "timeout": 90.0,
        "kill_timeout": 0.5,
        "stdin": "none",
        "bind_to": "none",
        "mca": (("orte_abort_on_non_zero_status", "0"), ("btl_tcp_if_include", "eth0")),
        # -x words, then env:, in file order; text as written (0.10, yes), empty = the launcher's value
        "exports": ("OMP_NUM_THREADS=4", "HOME", "DATA_PATH=./MNIST_Data/train/", "LR=0.10", "DEBUG=yes", "PATH"),
        "mpi": "pmi2",
    }
    assert job.apps == (FileApp(("python", "net.py", "--epochs", "010"), 16, None),)


def test_single_values_and_strings() -> None:
    job = parse("host: a:2,b:2\nx: FOO=1\nstdin: 0\ncommand: python t.py 'two words' --n=3\nwdir: /tmp\n")
    assert job.options == {"hosts": ("a:2,b:2",), "exports": ("FOO=1",), "stdin": "0"}
    assert job.apps == (FileApp(("python", "t.py", "two words", "--n=3"), None, "/tmp"),)


def test_mpmd_apps() -> None:
    job = parse(
        "wdir: /w\napps:\n  - np: 1\n    command: python server.py\n  - {np: 3, command: [python, w.py], wdir: /v}\n"
    )
    assert job.apps == (FileApp(("python", "server.py"), 1, "/w"), FileApp(("python", "w.py"), 3, "/v"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("np: 4\noversubscribe: true\n\n\n\n\nnp2: 3\n", "job.yaml:7: unknown key 'np2' (did you mean 'np'?)"),
        ("\n\n\n\n\n\nnp: eight\n", "job.yaml:7: key 'np': expected an integer, got 'eight'"),
        ("np: 0\n", "job.yaml:1: key 'np' takes a whole number from 1 to 65,536, got '0'"),
        ("np: 2.5\n", "job.yaml:1: key 'np': expected an integer, got '2.5'"),
        ("np:\n", "job.yaml:1: key 'np': expected an integer, got nothing"),
        ("np: [1]\n", "job.yaml:1: key 'np': expected an integer, got a list"),
        ("timeout: soon\n", "job.yaml:1: key 'timeout': expected a number, got 'soon'"),
        ("timeout: 0\n", "job.yaml:1: key 'timeout' takes a number of seconds above 0, at most 31,536,000, got '0.0'"),
        ("oversubscribe: 1\n", "job.yaml:1: key 'oversubscribe': expected true or false, got '1'"),
        ("map-by: node\n", "job.yaml:1: unknown key 'map-by' (did you mean 'map_by'?)"),
        ("colour: blue\n", "job.yaml:1: unknown key 'colour'"),
        ("config: other.yaml\n", "job.yaml:1: unknown key 'config'"),
        ("np: 2\nnp: 3\n", "job.yaml:2: key 'np' given twice (first on line 1)"),
        (
            "hostfile: a\nmachinefile: b\n",
            "job.yaml:2: key 'machinefile' sets the same option as 'hostfile' (first on line 1)",
        ),
        ("mpi: pmi3\n", "job.yaml:1: key 'mpi' takes one of auto, pmi1, pmi2, pmix, none, got 'pmi3'"),
        ("stdin: first\n", "job.yaml:1: key 'stdin' takes a rank number, all or none, got 'first'"),
        ("host: [a:2, {b: 2}]\n", "job.yaml:1: key 'host': expected a string, got a mapping"),
        ("host:\n  - a:2\n  - -b\n", "job.yaml:3: key 'host': '-b': invalid host name '-b'"),
        ("x:\n  - A=1\n  - 1BAD\n", "job.yaml:3: key 'x': '1BAD' is not a variable name"),
        ("x: [1BAD=2]\n", "job.yaml:1: key 'x': '1BAD' is not a variable name"),
        ("mca: [a, b]\n", "job.yaml:1: key 'mca': expected a mapping of names to values, got a list"),
        ("mca:\n  a: 1\n  a: 2\n", "job.yaml:3: key 'mca': 'a' given twice (first on line 2)"),
        ("env:\n  A-B: 1\n", "job.yaml:2: key 'env': 'A-B' is not a valid name"),
        ("env:\n  A: [1, 2]\n", "job.yaml:2: key 'env': expected a string, got a list"),
        ("env: A=1\n", "job.yaml:1: key 'env': expected a mapping of variable names to values, got 'A=1'"),
        ("command: []\n", "job.yaml:1: key 'command': no program given"),
        ("command: python 'unclosed\n", "job.yaml:1: key 'command': No closing quotation"),
        ("command: [python, [a]]\n", "job.yaml:1: key 'command': expected a string, got a list"),
        ("apps: []\n", "job.yaml:1: key 'apps': expected a list of programs, got a list"),
        ("apps:\n  - np: 1\n", "job.yaml:2: key 'apps': a program without 'command'"),
        ("apps:\n  - command: a\n    host: x\n", "job.yaml:3: unknown key 'host' in an app"),
        ("apps:\n  - command: a\ncommand: b\n", "job.yaml:1: key 'apps': give either 'command' or 'apps', not both"),
        ("np: 2\napps:\n  - command: a\n", "job.yaml:1: key 'np': with 'apps', give np in each app"),
        ("- np: 2\n", "job.yaml:1: expected a mapping of option names to values, got a list"),
        ("just text\n", "job.yaml:1: expected a mapping of option names to values, got 'just text'"),
        ("np: 2\n  bad: indent\n", "job.yaml:2: YAML: mapping values are not allowed here"),
        ("np: 4\ncommand: [python, t.py\n", "job.yaml:2: YAML: while parsing a flow sequence, expected ',' or ']'"),
        ("np: 4\nenv: {A: 1\n\n\n", "job.yaml:2: YAML: while parsing a flow mapping, expected ',' or '}'"),
        (
            "np: 2\n---\nnp: 3\n",
            "job.yaml:2: YAML: expected a single document in the stream, but found another document",
        ),
        ("np: 2\nhost: \x00\n", "job.yaml:2: YAML: character U+0000 is not allowed"),
        ("np: 2\n\tx: 1\n", "job.yaml:2: YAML: while scanning for the next token, found character '\\t' that"),
        ("[a]: 1\n", "job.yaml:1: expected an option name as key, got a list"),
        ("~: 1\n", "job.yaml:1: expected an option name as key, got nothing"),
        ("apps:\n  - {command: a, ~: 2}\n", "job.yaml:2: expected an option name as key, got nothing"),
        ("x" * 500 + ": 1\n", "job.yaml:1: unknown key 'xxxxxxxx"),
        ("", "job.yaml: the job file is empty"),
        ("# only a comment\n", "job.yaml: the job file is empty"),
    ],
)
def test_errors_name_the_line_and_key(text: str, message: str) -> None:
    with pytest.raises(LaunchError) as info:
        parse(text)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)
    assert info.value.status == 2


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    with pytest.raises(LaunchError, match=r"^job\.yaml"):
        parse("np: " + "[" * 5000 + "]" * 5000 + "\n")


def test_yaml_tags_are_never_constructed() -> None:
    """Nodes, not objects: a python/object tag is just text (and here a wrong type)."""
    with pytest.raises(LaunchError, match="key 'np': expected an integer"):
        parse("np: !!python/object/apply:os.system ['touch /tmp/owned']\n")
    assert parse("command: !!python/object/apply:os.system echo\n").apps[0].argv == ("echo",)


# ---- merged with the command line ----------------------------------------------------------------


def test_command_line_options_win(tmp_path: Path) -> None:
    text = "np: 4\nmap_by: node\ntimeout: 30\ntag_output: true\ncommand: [python, net.py]\n"
    spec = spec_of(tmp_path, text)
    assert spec.apps == (AppContext(("python", "net.py"), 4, (), None),)
    assert (spec.options.map_by, spec.options.timeout, spec.options.tag_output) == ("node", 30.0, True)
    spec = spec_of(tmp_path, text, "-n", "2", "--map-by", "slot", "--timeout", "5")
    assert spec.apps[0].np == 2
    assert (spec.options.map_by, spec.options.timeout, spec.options.tag_output) == ("slot", 5.0, True)


def test_a_program_on_the_command_line_replaces_the_command(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "np: 3\nwdir: /tmp\ncommand: [python, net.py]\n", "hostname", "-s")
    assert spec.apps == (AppContext(("hostname", "-s"), 3, (), "/tmp"),)
    spec = spec_of(tmp_path, "np: 3\ncommand: [python, net.py]\n", "-n", "1", "a", ":", "-n", "2", "b")
    assert [(a.argv, a.np) for a in spec.apps] == [(("a",), 1), (("b",), 2)]


def test_exports_and_mca_add_up_with_the_command_line_last(tmp_path: Path) -> None:
    text = "env: {A: file, B: file}\nx: [C=file]\nmca: {k1: file, k2: file}\ncommand: [true]\n"
    spec = spec_of(tmp_path, text, "-x", "B=cli", "--mca", "k2", "cli")
    assert spec.apps[0].exports == (("A", "file"), ("B", "file"), ("C", "file"), ("B", "cli"))  # file order, then -x
    assert spec.options.mca == (("k1", "file"), ("k2", "file"), ("k2", "cli"))


def test_command_line_hosts_replace_both_host_keys(tmp_path: Path) -> None:
    text = "host: a:2\nhostfile: hf\ncommand: [true]\n"
    spec = spec_of(tmp_path, text)
    assert (spec.options.hosts, spec.options.hostfile) == (("a:2",), "hf")
    spec = spec_of(tmp_path, text, "-H", "b:1")
    assert (spec.options.hosts, spec.options.hostfile) == (("b:1",), None)
    spec = spec_of(tmp_path, text, "--hostfile", "other")
    assert (spec.options.hosts, spec.options.hostfile) == ((), "other")


def test_mpmd_from_the_file(tmp_path: Path) -> None:
    text = "apps:\n  - {np: 1, command: python server.py}\n  - {np: 3, command: python worker.py}\n"
    spec = spec_of(tmp_path, text, "--wdir", "/tmp")
    assert [(a.argv, a.np, a.wdir) for a in spec.apps] == [
        (("python", "server.py"), 1, "/tmp"),
        (("python", "worker.py"), 3, "/tmp"),
    ]
    with pytest.raises(LaunchError, match="has 2 apps; give np in each"):
        spec_of(tmp_path, text, "-n", "4")


def test_no_program_anywhere(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"^no program given; .* or command: in "):
        spec_of(tmp_path, "np: 2\n")
    with pytest.raises(LaunchError, match="no program given in app context 2"):
        spec_of(tmp_path, "np: 2\ncommand: [a]\n", "b", ":")


# ---- fuzzing --------------------------------------------------------------------------------------


@given(st.text(max_size=200))
@settings(max_examples=500, deadline=None)
def test_fuzz_any_text_only_raises_launch_errors(text: str) -> None:
    try:
        parse(text, "fuzz.yaml")
    except LaunchError as exc:
        assert str(exc).startswith("fuzz.yaml") and "\n" not in str(exc), str(exc)


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 100), st.floats(allow_nan=True), st.text(max_size=12))
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
_keys = st.sampled_from([*option_keys(PARAMS), "env", "command", "apps", "junk"])


@given(st.dictionaries(_keys, _values, max_size=6))
@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
def test_fuzz_job_files_through_parse_args(tmp_path: Path, data: dict) -> None:
    """Random but well-formed YAML: parse_args gives a JobSpec or one LaunchError naming the file."""
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        spec = parse_args(["--config", str(path), "true"])
    except LaunchError as exc:
        assert "\n" not in str(exc), str(exc)
        return
    options = spec.options
    assert all(isinstance(getattr(options, name), bool) for name in ("oversubscribe", "tag_output", "pmi_tcp"))
    assert all(isinstance(h, str) for h in options.hosts)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in options.mca)
    assert spec.apps[0].np is None or spec.apps[0].np >= 1
