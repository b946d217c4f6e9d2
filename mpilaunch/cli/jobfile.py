"""Job files (`mpilaunch --config job.yaml`): the command line written down as YAML.

The keys are the long option names of the command with underscores (derived from its click
parameters, so a new option is a new key), plus `env:`, `command:` and `apps:`. Parsing is
a pure function of the text; every mistake is one LaunchError naming the file, the line and
the key (status 2). The YAML is composed into nodes, not constructed into Python objects: the
nodes carry line numbers, and the text of each scalar is taken as written, so `010`, `1.10`
or `yes` stay what the user typed instead of becoming 8, 1.1 or True.

Only imported when --config is given: pyyaml costs start-up time a plain run must not pay.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import click

from mpilaunch.cli import cliopts
from mpilaunch.errors import LaunchError
from mpilaunch.plan.spec import AppContext
from mpilaunch.plan.textfiles import read_text

JOBFILE_MAX = 1 << 20
EXPANDED_MAX = 4 * JOBFILE_MAX  # characters a job file may stand for once its aliases are expanded
APP_KEYS = ("np", "wdir", "command")  # what an entry of `apps:` may set
EXTRA_KEYS = ("env", "command", "apps")
_INT_RE = re.compile(r"[+-]?[0-9]{1,15}")
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]{1,15}(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
_NUMBERS = {"int": ("an integer", _INT_RE, int), "float": ("a number", _FLOAT_RE, float)}  # kind -> its check
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_NULL_TAG = "tag:yaml.org,2002:null"


@dataclass(frozen=True)
class FileApp:
    """One program of the file: `command:` with the top-level np/wdir, or an entry of `apps:`."""

    argv: tuple[str, ...]
    np: int | None = None
    wdir: str | None = None


@dataclass(frozen=True)
class JobFile:
    """What a job file asks for, in the command line's terms (click parameter names)."""

    path: str
    options: dict[str, object] = field(default_factory=dict)  # click parameter name -> value
    apps: tuple[FileApp, ...] = ()  # empty when the file has no command
    np: int | None = None  # top level, for a command given on the command line
    wdir: str | None = None


class _Bad(Exception):
    """A mistake at a line; parse_job_file adds the path."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line


def option_keys(params: Iterable[click.Parameter]) -> dict[str, click.Option]:
    """Key -> option: every `--long-name` as long_name (`-x`, which has none, is `x`)."""
    keys: dict[str, click.Option] = {}
    not_keys = cliopts.named(cliopts.NO_KEY)  # no other file; hydra's words for what x: and env: say
    for param in params:
        if not isinstance(param, click.Option) or not param.expose_value or param.name in not_keys:
            continue
        spellings = [o for o in param.opts if o.startswith("--")] or list(param.opts)
        for spelling in spellings:
            keys.setdefault(spelling.lstrip("-").replace("-", "_"), param)
    return keys


def _kind(param: click.Option) -> str:
    if param.is_flag:
        return "bool"
    if param.multiple:
        return "pairs" if param.nargs == 2 else "list"
    if isinstance(param.type, click.types.IntParamType):
        return "int"
    if isinstance(param.type, click.types.FloatParamType):
        return "float"
    return "str"


def _line(node) -> int:  # type: ignore[no-untyped-def]
    return node.start_mark.line + 1


def _quoted(text: str) -> str:
    """A user's text quoted for a one-line message, shortened when long."""
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:56] + "...'"


def _shown(node) -> str:  # type: ignore[no-untyped-def]
    """How a node reads in a message: its text, or what kind of thing it is."""
    import yaml

    if isinstance(node, yaml.ScalarNode):
        return "nothing" if node.tag == _NULL_TAG else _quoted(node.value)
    return "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"


def _scalar(node, key: str, expected: str) -> str:  # type: ignore[no-untyped-def]
    """The text of a scalar node, as written; anything else is a type error."""
    import yaml

    if not isinstance(node, yaml.ScalarNode) or node.tag == _NULL_TAG:
        raise _Bad(_line(node), f"key {key!r}: expected {expected}, got {_shown(node)}")
    return node.value


def _key(node) -> str:  # type: ignore[no-untyped-def]
    """The text of a mapping key; a key that is a list, a mapping or empty is an error."""
    import yaml

    if not isinstance(node, yaml.ScalarNode) or node.tag == _NULL_TAG:
        raise _Bad(_line(node), f"expected an option name as key, got {_shown(node)}")
    return node.value


def _strings(node, key: str) -> list[str]:  # type: ignore[no-untyped-def]
    """A string, or a list of strings."""
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return [_scalar(item, key, "a string") for item in node.value]
    return [_scalar(node, key, "a string or a list of strings")]


def _mapping(node, key: str, what: str) -> list[tuple[str, object]]:  # type: ignore[no-untyped-def]
    """(name, value node) pairs of a mapping of names; a repeated name is an error."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        raise _Bad(_line(node), f"key {key!r}: expected a mapping of {what}, got {_shown(node)}")
    seen: dict[str, int] = {}
    out = []
    for name_node, value in node.value:
        name = _scalar(name_node, key, "a name")
        if not _NAME_RE.fullmatch(name):
            raise _Bad(_line(name_node), f"key {key!r}: {name!r} is not a valid name")
        if name in seen:
            raise _Bad(_line(name_node), f"key {key!r}: {name!r} given twice (first on line {seen[name]})")
        seen[name] = _line(name_node)
        out.append((name, value))
    return out


def _convert(param: click.Option, key: str, value: object, line: int) -> object:
    """Let the option's own click type and callback check the value, as on the command line."""
    try:
        if param.multiple and param.nargs == 1:
            value = tuple(param.type.convert(v, param, None) for v in value)  # type: ignore[attr-defined]
        elif not param.is_flag and not param.multiple:
            value = param.type.convert(value, param, None)
        if param.callback is not None:
            value = param.callback(None, param, value)  # type: ignore[arg-type]
    except click.ClickException as exc:
        said = f"key {key!r} {exc.message}" if exc.message.startswith("takes ") else f"key {key!r}: {exc.message}"
        raise _Bad(line, said) from None
    return value


def _typed(param: click.Option, key: str, node) -> object:  # type: ignore[no-untyped-def]
    """The value of one option key, in the form click gives parse_args."""
    kind = _kind(param)
    line = _line(node)
    if kind == "bool":
        text = _scalar(node, key, "true or false")
        if text.lower() not in _BOOLS:
            raise _Bad(line, f"key {key!r}: expected true or false, got {_shown(node)}")
        return _BOOLS[text.lower()]
    if kind in _NUMBERS:
        what, pattern, number = _NUMBERS[kind]
        text = _scalar(node, key, what)
        if not pattern.fullmatch(text.strip()):
            raise _Bad(line, f"key {key!r}: expected {what}, got {_shown(node)}")
        return _convert(param, key, number(text), line)
    if kind == "pairs":
        pairs = tuple((name, _scalar(value, key, "a value")) for name, value in _mapping(node, key, "names to values"))
        return _convert(param, key, pairs, line)
    if kind == "list":
        return _convert(param, key, tuple(_strings(node, key)), line)
    return _convert(param, key, _scalar(node, key, "a string"), line)


def _command(node, key: str = "command") -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    """A list of words, or one string split as a shell would (without expanding anything)."""
    import yaml

    if isinstance(node, yaml.SequenceNode):
        words = [_scalar(item, key, "a string") for item in node.value]
    else:
        text = _scalar(node, key, "a list of words or a string")
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise _Bad(_line(node), f"key {key!r}: {exc}") from None
    if not words or not words[0]:
        raise _Bad(_line(node), f"key {key!r}: no program given")
    return tuple(words)


def _item_lines(node) -> list[int]:  # type: ignore[no-untyped-def]
    """The line of each item of a list (or of the one value), for errors about one item."""
    import yaml

    return [_line(item) for item in node.value] if isinstance(node, yaml.SequenceNode) else [_line(node)]


def _check_hosts(values: tuple[str, ...], key: str, lines: list[int]) -> None:
    from mpilaunch.plan.hosts import parse_host_list

    for value, line in zip(values, lines):
        try:
            parse_host_list(value, label=f"key {key!r}: {_quoted(value)}")
        except LaunchError as exc:
            raise _Bad(line, str(exc)) from None


def _check_exports(values: tuple[str, ...], key: str, lines: list[int]) -> None:
    from mpilaunch.plan.rank_env import valid_env_name

    for item, line in zip(values, lines):
        if not valid_env_name(item.partition("=")[0]):
            raise _Bad(line, f"key {key!r}: {_quoted(item.partition('=')[0])} is not a variable name")


def _env(node) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    """`env:` as -x words: NAME=value, or NAME alone (the launcher's value) for an empty value."""
    import yaml

    out = []
    for name, value in _mapping(node, "env", "variable names to values"):
        if isinstance(value, yaml.ScalarNode) and value.tag == _NULL_TAG:
            out.append(name)
        else:
            out.append(f"{name}={_scalar(value, 'env', 'a string')}")
    return tuple(out)


def _suggest(key: str, known: Iterable[str]) -> str:
    names = sorted(known)
    if key.replace("-", "_") in names:
        return f" (did you mean {key.replace('-', '_')!r}?)"
    close = difflib.get_close_matches(key, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _apps(node, np_param: click.Option) -> tuple[FileApp, ...]:  # type: ignore[no-untyped-def]
    import yaml

    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise _Bad(_line(node), f"key 'apps': expected a list of programs, got {_shown(node)}")
    apps = []
    for entry in node.value:
        if not isinstance(entry, yaml.MappingNode):
            raise _Bad(_line(entry), f"key 'apps': each program is a mapping of {', '.join(APP_KEYS)}")
        fields: dict[str, object] = {}
        seen: dict[str, int] = {}
        for key_node, value in entry.value:
            key = _key(key_node)
            if key not in APP_KEYS:
                raise _Bad(_line(key_node), f"unknown key {_quoted(key)} in an app{_suggest(key, APP_KEYS)}")
            if key in seen:
                raise _Bad(_line(key_node), f"key {key!r} given twice (first on line {seen[key]})")
            seen[key] = _line(key_node)
            if key == "command":
                fields[key] = _command(value)
            elif key == "np":
                fields[key] = _typed(np_param, "np", value)
            else:
                fields[key] = _scalar(value, "wdir", "a string")
        if "command" not in fields:
            raise _Bad(_line(entry), "key 'apps': a program without 'command'")
        apps.append(FileApp(fields["command"], fields.get("np"), fields.get("wdir")))  # type: ignore[arg-type]
    return tuple(apps)


def _compose(text: str, path: str):  # type: ignore[no-untyped-def]
    import yaml

    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        if mark is None or mark.index >= len(text.rstrip()):  # found at the end: where the open thing began
            mark = exc.context_mark or mark
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        words = ", ".join(w for w in (exc.context, exc.problem) if w) or "not valid YAML"
        raise LaunchError(f"{where}: YAML: {' '.join(words.split())}") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, max(exc.position, 0)) + 1
        code = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "\0")
        raise LaunchError(f"{path}:{line}: YAML: character U+{code:04X} is not allowed") from None
    except yaml.YAMLError as exc:
        raise LaunchError(f"{path}: YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise LaunchError(f"{path}: YAML: nested too deeply") from None


def expanded_size(root, limit: int) -> int | None:  # type: ignore[no-untyped-def]
    """The characters a composed document stands for with every alias expanded (a node counts
    each time it is used), as soon as that is more than limit; None when an alias sits inside
    the node it names (it would expand without end). YAML's aliases let a file of 1 MiB stand
    for gigabytes; the nodes are shared, so this walks each one once (iteratively: any depth)."""
    import yaml

    sizes: dict[int, int] = {}
    on_path: set[int] = set()  # the nodes being walked (a loop is an alias to one of them)
    pending: list[tuple[object, bool]] = [(root, False)]
    while pending:
        node, children_done = pending.pop()
        key = id(node)
        if isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = node.value if isinstance(node, yaml.SequenceNode) else []  # type: ignore[attr-defined]
        if children_done:
            on_path.discard(key)
            own = len(node.value) if isinstance(node, yaml.ScalarNode) else 0  # type: ignore[attr-defined]
            sizes[key] = 1 + own + sum(sizes[id(child)] for child in children)
            if sizes[key] > limit:
                return sizes[key]
            continue
        if key in sizes:
            continue
        if key in on_path:
            return None
        on_path.add(key)
        pending.append((node, True))
        pending.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


def parse_job_file(text: str, path: str, params: Sequence[click.Parameter]) -> JobFile:
    """Job file text -> JobFile; params are the command's (for the keys and their types)."""
    import yaml

    root = _compose(text, path)
    if root is None:
        raise LaunchError(f"{path}: the job file is empty")
    size = expanded_size(root, EXPANDED_MAX)
    if size is None:
        raise LaunchError(f"{path}: YAML: an alias inside the node it names (it expands without end)")
    if size > EXPANDED_MAX:
        raise LaunchError(f"{path}: YAML: its aliases expand it beyond {EXPANDED_MAX >> 20} MiB of text; refused")
    keys = option_keys(params)
    try:
        if not isinstance(root, yaml.MappingNode):
            raise _Bad(_line(root), f"expected a mapping of option names to values, got {_shown(root)}")
        return _parse_root(root, path, keys)
    except _Bad as bad:
        raise LaunchError(f"{path}:{bad.line}: {' '.join(str(bad).split())}") from None
    except RecursionError:
        raise LaunchError(f"{path}: nested too deeply") from None


def _parse_root(root, path: str, keys: Mapping[str, click.Option]) -> JobFile:  # type: ignore[no-untyped-def]
    options: dict[str, object] = {}
    set_by: dict[str, tuple[str, int]] = {}  # parameter name -> (key, line)
    exports: list[str] = []
    np = wdir = command = apps = None
    apps_line = np_line = 0
    for key_node, value in root.value:
        key = _key(key_node)
        line = _line(key_node)
        param = keys.get(key)
        if param is None and key not in EXTRA_KEYS:
            raise _Bad(line, f"unknown key {_quoted(key)}{_suggest(key, [*keys, *EXTRA_KEYS])}")
        name = param.name if param is not None else key
        if name in set_by:
            first, first_line = set_by[name]
            same = "given twice" if first == key else f"sets the same option as {first!r}"
            raise _Bad(line, f"key {key!r} {same} (first on line {first_line})")
        set_by[name] = (key, line)  # type: ignore[index]
        if key == "env":
            exports.extend(_env(value))
        elif key == "command":
            command = _command(value)
        elif key == "apps":
            apps, apps_line = _apps(value, keys["np"]), line
        elif name == "np":
            np, np_line = _typed(param, key, value), line  # type: ignore[arg-type]
        elif name == "wdir":
            wdir = _typed(param, key, value)  # type: ignore[arg-type]
        else:
            typed = _typed(param, key, value)  # type: ignore[arg-type]
            if name == "hosts":
                _check_hosts(typed, key, _item_lines(value))  # type: ignore[arg-type]
            if name == "exports":
                _check_exports(typed, key, _item_lines(value))  # type: ignore[arg-type]
                exports.extend(typed)  # type: ignore[arg-type]
                continue
            options[name] = typed  # type: ignore[index]
    if apps is not None and command is not None:
        raise _Bad(apps_line, "key 'apps': give either 'command' or 'apps', not both")
    if apps is not None and np is not None:
        raise _Bad(np_line, "key 'np': with 'apps', give np in each app")
    if exports:
        options["exports"] = tuple(exports)
    if command is not None:
        apps = (FileApp(command, np, wdir),)  # type: ignore[arg-type]
    elif apps is not None:
        apps = tuple(FileApp(a.argv, a.np, a.wdir or wdir) for a in apps)  # type: ignore[arg-type]
    return JobFile(path, options, apps or (), np, wdir)  # type: ignore[arg-type]


def read_job_file(path: str, params: Sequence[click.Parameter]) -> JobFile:
    text = read_text(path, "job file", JOBFILE_MAX)
    return parse_job_file(text, path, params)


def merge_options(file_options: Mapping[str, object], options: dict[str, object], given: set[str]) -> None:
    """A job file's options under the command line's (options, updated in place): options the
    command line gave win; -x, env: and -mca add up (the command line last, so it wins for a
    name); -H or --hostfile on the command line replaces both host keys of the file."""
    for name, value in file_options.items():
        if name in ("exports", "mca"):
            options[name] = tuple(value) + tuple(options[name])  # type: ignore[arg-type]
        elif name in ("hosts", "hostfile") and given & {"hosts", "hostfile"}:
            continue
        elif name not in given:
            options[name] = value


def apply_job_file(
    job: JobFile, options: dict[str, object], given: set[str], apps: list[AppContext]
) -> list[AppContext]:
    """Merge a job file under the command line (merge_options); a program on the command line
    replaces the file's. Returns the apps; options (parse_args' globals) is updated in place."""
    merge_options(job.options, options, given)
    if apps and apps[0].argv:  # programs on the command line: the file's np and wdir as defaults
        single = len(apps) == 1
        return [
            a._replace(np=a.np if a.np is not None or not single else job.np, wdir=a.wdir or job.wdir) for a in apps
        ]
    if not job.apps:
        raise LaunchError(f"no program given; usage: mpilaunch [options] program [args], or command: in {job.path}")
    cli = apps[0] if apps else AppContext(())
    if cli.np is not None and len(job.apps) > 1:
        raise LaunchError(f"-n on the command line: {job.path} has {len(job.apps)} apps; give np in each")
    return [
        AppContext(a.argv, cli.np if cli.np is not None else a.np, cli.exports, cli.wdir or a.wdir) for a in job.apps
    ]
