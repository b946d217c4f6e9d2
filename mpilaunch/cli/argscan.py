"""The fast path for a command line: click's parse, for the spellings people type, without click.

Importing click costs a plain run more than starting all its ranks, so the run command's words
are scanned here first, against the same table click's command is built from. Anything this
scanner is not sure of (--help, --version, a bad value, an unknown option, a value glued on in
an unusual way) returns None, and the caller asks click, which gives its own message. A test
compares both parsers on generated command lines.
"""

from __future__ import annotations

from mpilaunch.cli.cliopts import (
    CHOICE,
    ENV,
    FLAG,
    FLOAT_NONNEG,
    FLOAT_POS,
    INT_MIN0,
    INT_MIN1,
    MULTI,
    PAIRS,
    RANK_CHOICE,
    RUN_OPTIONS,
    Opt,
    stdin_choice,
)

BY_FLAG = {flag: opt for opt in RUN_OPTIONS for flag in opt.flags}  # every spelling -> its option
_NO = object()  # a value the scanner leaves to click


def _number(text: str, opt: Opt) -> object:
    """Only plain decimal numbers in the option's range; click decides everything else (signs,
    '1_0', 'inf', spaces, too large), and gives the message."""
    check = opt.check
    if check in (INT_MIN1, INT_MIN0):
        if not (text.isascii() and text.isdigit() and len(text) <= 18):
            return _NO
        value: float = int(text)
        if value < (1 if check == INT_MIN1 else 0):
            return _NO
    else:
        whole, _, frac = text.partition(".")
        if not (whole or frac) or not text.isascii() or not (whole + frac).isdigit() or len(whole) > 18:
            return _NO
        value = float(text)
        if not (value > 0 or (check == FLOAT_NONNEG and value == 0)):
            return _NO
    return value if opt.maximum is None or value <= opt.maximum else _NO


def _value(opt: Opt, text: str) -> object:
    check = opt.check
    if check is None:
        return text
    if check in (INT_MIN1, INT_MIN0, FLOAT_POS, FLOAT_NONNEG):
        return _number(text, opt)
    if check == CHOICE:
        return text.lower() if text.isascii() and text.lower() in opt.choices else _NO
    if check == RANK_CHOICE:
        return stdin_choice(text) or _NO
    return _NO


class OptionWord:
    """One option of a command line: where it is, as written, its row and the words it takes
    (values: the value glued on with `=` or to a short option, then the words after it)."""

    __slots__ = ("index", "opt", "taken", "values", "word")

    def __init__(self, index: int, word: str, opt: Opt | None, taken: int, values: tuple[str, ...]) -> None:
        self.index = index
        self.word = word
        self.opt = opt  # None: no option of the table (the walk ends there)
        self.taken = taken  # words after it that are its values
        self.values = values


def option_words(words: list[str]):  # type: ignore[no-untyped-def]
    """The options of one app context, up to its program (or `--`, or a word no option is):
    each as an OptionWord. hydra's -genv takes NAME=VALUE or NAME VALUE; a value may be glued to
    a short option (-n4, -xFOO=1)."""
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--" or len(word) < 2 or word[0] != "-":
            return
        name, eq, glued = word.partition("=")
        opt = BY_FLAG.get(name)
        if opt is None:
            short = None if word.startswith("--") else BY_FLAG.get(word[:2])
            if short is not None and short.kind != FLAG:
                yield OptionWord(i, word, short, 0, (word[2:],))
                i += 1
                continue
            yield OptionWord(i, word, None, 0, ())
            return
        need = {FLAG: 0, PAIRS: 2}.get(opt.kind, 1)
        if opt.kind == ENV and not eq and i + 1 < len(words) and "=" not in words[i + 1]:
            need = 2
        taken = min(max(need - (1 if eq else 0), 0), len(words) - i - 1)
        values = ((glued,) if eq else ()) + tuple(words[i + 1 : i + 1 + taken])
        yield OptionWord(i, word, opt, taken, values)
        i += 1 + taken


def split_apps(argv: list[str]) -> list[list[str]]:
    """MPMD: ' : ' separates app contexts."""
    segments: list[list[str]] = [[]]
    for word in argv:
        if word == ":":
            segments.append([])
        else:
            segments[-1].append(word)
    return segments


def scan(words: list[str]) -> tuple[dict[str, object], set[str]] | None:
    """One app context's words -> (params, names given) as click's command gives them, or None."""
    values: dict[str, object] = {}  # what the words give; the names given are its keys
    i, count = 0, len(words)
    while i < count:
        word = words[i]
        if word == "--":
            i += 1
            break
        if len(word) < 2 or word[0] != "-":
            break
        name, eq, glued = word.partition("=")
        opt = BY_FLAG.get(name)
        if opt is None or (eq and len(name) == 2):  # -n=4 is -n with '=4' to click; leave it there
            return None
        if opt.kind == FLAG:
            if eq:
                return None
            values[opt.name] = True
            i += 1
        else:
            args = [glued] if eq else []
            need = 2 if opt.kind == PAIRS else 1
            args += words[i + 1 : i + 1 + need - len(args)]
            if len(args) < need:
                return None
            i += 1 + need - (1 if eq else 0)
            if opt.kind == PAIRS:
                values.setdefault(opt.name, []).append((args[0], args[1]))  # type: ignore[union-attr]
                continue
            value = _value(opt, args[0])
            if value is _NO:
                return None
            if opt.kind in (MULTI, ENV):
                values.setdefault(opt.name, []).append(value)  # type: ignore[union-attr]
            else:
                values[opt.name] = value
    given = set(values)
    params: dict[str, object] = {}
    for opt in RUN_OPTIONS:
        value = values.get(opt.name, _NO)
        if opt.kind in (MULTI, PAIRS, ENV):
            params[opt.name] = tuple(value) if value is not _NO else ()  # type: ignore[arg-type]
        elif value is _NO:
            params[opt.name] = False if opt.kind == FLAG else opt.default
        else:
            params[opt.name] = value
    params["argv"] = tuple(words[i:])
    if i < count:
        given.add("argv")
    return params, given
