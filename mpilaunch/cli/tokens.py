"""The one walk over a command line: its words as tokens, against the options table (cliopts).

Every reader takes its tokens from here: what the line asks for (help, a version, a job), whose
words it speaks (cli/dialect.py), the early start, the PMIx guess and the parse. Argv is walked
once; the dialect respells tokens, `scan` reads them and checks their values in one pass over
them, and `render` writes them back as words for click.

Importing click costs a plain run more than starting all its ranks, so `scan` reads the
spellings people type as click's command would, and leaves anything it is not sure of (a bad
value, an unknown option, a value glued on in an unusual way) to click, which gives its own
message. A test compares both on generated command lines.
"""

from __future__ import annotations

from mpilaunch.cli import cliopts
from mpilaunch.cli.cliopts import (
    CHOICE,
    ENV,
    FLAG,
    FLOAT_NONNEG,
    INT_MIN0,
    INT_MIN1,
    MULTI,
    PAIRS,
    RANK_CHOICE,
    STREAMS,
    Opt,
)

_NO = object()  # a value the scanner leaves to click


class Token:
    """One option of an app context: where it is, as written, its row, and its values (the value
    glued on with `=` or to a short option, then the words after it)."""

    __slots__ = ("eq", "glued", "index", "opt", "taken", "values", "word")

    def __init__(
        self, index: int, word: str, opt: Opt | None, taken: int = 0, values: tuple[str, ...] = (), how: str = ""
    ) -> None:
        self.index = index
        self.word = word
        self.opt = opt  # None: no option of the table (the walk ends there)
        self.taken = taken  # words after it that are its values
        self.values = values
        self.eq = how == "="  # its first value was written after '=' in the same word
        self.glued = how == "glued"  # its value is glued to a short option (-n4, -xFOO=1)

    @property
    def head(self) -> str:
        return self.word.partition("=")[0]


def tokens(words: list[str]) -> list[Token]:
    """The options of one app context, up to its program (or `--`, or a word no option is, which
    ends them as a token without a row). hydra's -genv takes NAME=VALUE or NAME VALUE; a value
    may be glued to a short option (-n4, -xFOO=1)."""
    out: list[Token] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--" or len(word) < 2 or word[0] != "-":
            break
        name, eq, glued = word.partition("=")
        opt = cliopts.row_for(name)
        if opt is None:
            short = None if word.startswith("--") else cliopts.row_for(word[:2])
            if short is None or short.kind == FLAG:
                out.append(Token(i, word, None))
                break
            out.append(Token(i, word, short, 0, (word[2:],), "glued"))
            i += 1
            continue
        need = {FLAG: 0, PAIRS: 2}.get(opt.kind, 1)
        if opt.kind == ENV and not eq and i + 1 < len(words) and "=" not in words[i + 1]:
            need = 2
        taken = min(max(need - (1 if eq else 0), 0), len(words) - i - 1)
        out.append(Token(i, word, opt, taken, ((glued,) if eq else ()) + tuple(words[i + 1 : i + 1 + taken]), eq))
        i += 1 + taken
    return out


def respelled(t: Token, word: str, values: tuple[str, ...], eq: bool) -> Token:
    """The token as written `word` (a spelling of the table), its first value after '=' or not."""
    opt = t.opt if word == t.head else cliopts.row_for(word)
    return Token(t.index, f"{word}={values[0]}" if eq else word, opt, t.taken, values, "=" if eq else "")


def split_apps(argv: list[str]) -> list[list[str]]:
    """MPMD: ' : ' separates app contexts."""
    segments: list[list[str]] = [[]]
    for word in argv:
        if word == ":":
            segments.append([])
        else:
            segments[-1].append(word)
    return segments


def program_at(toks: list[Token], words: list[str]) -> int:
    """Where the program of an app context starts (past a `--`)."""
    end = toks[-1].index + 1 + toks[-1].taken if toks else 0
    return end + 1 if end < len(words) and words[end] == "--" else end


def render(toks: list[Token], words: list[str]) -> list[str]:
    """An app context's words as its tokens now read (cli/dialect respells some): for click."""
    out: list[str] = []
    for t in toks:
        out += [t.word] if t.eq or t.glued or t.opt is None else [t.word, *t.values]
    end = toks[-1].index + 1 + toks[-1].taken if toks else 0
    return out + words[end:]


def scan(words: list[str], toks: list[Token] | None = None) -> tuple[dict[str, object], set[str]] | None:
    """One app context (its tokens, else walked here) -> (params, names given) as click's command
    gives them, or None."""
    toks = tokens(words) if toks is None else toks
    values: dict[str, object] = {}  # what the words give; the names given are its keys
    for t in toks:
        opt = t.opt
        need = {FLAG: 0, PAIRS: 2}.get(opt.kind, 1) if opt is not None else -1
        if opt is None or t.glued or len(t.values) != need or (t.eq and len(t.head) == 2):
            return None  # -n=4 is -n with '=4' to click; a flag with a value is click's error
        if opt.kind == FLAG:
            values[opt.name] = True
        elif opt.kind == PAIRS:
            values.setdefault(opt.name, []).append(t.values)  # type: ignore[union-attr]
        else:
            value = _value(opt, t.values[0])
            if value is _NO:
                return None
            if opt.kind in (ENV, MULTI):
                values.setdefault(opt.name, []).append(value)  # type: ignore[union-attr]
            else:
                values[opt.name] = value
    given = set(values)
    params = {opt.name: opt.unset for opt in cliopts.rows()}
    params.update((name, tuple(value) if isinstance(value, list) else value) for name, value in values.items())
    at = program_at(toks, words)
    params["argv"] = tuple(words[at:])
    if at < len(words):
        given.add("argv")
    return params, given


def _value(opt: Opt, text: str) -> object:
    """A value as click's type for the row gives it, or _NO for click to refuse."""
    check = opt.check
    if check is None or check == STREAMS:
        return text
    if check == CHOICE:
        return text.lower() if text.isascii() and text.lower() in opt.choices else _NO
    if check == RANK_CHOICE:
        return cliopts.stdin_choice(text) or _NO
    return _number(text, opt)


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
