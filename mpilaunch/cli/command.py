"""The run command as click sees it, built from the options table (cliopts): for every error
message and job files. Imported only when the fast scanner is unsure, or for those; `--help` is
cli/helptext.py's."""

from __future__ import annotations

import functools

from mpilaunch.cli import cliopts
from mpilaunch.cli.cliopts import stdin_choice


def _stdin_callback(ctx: object, param: object, value: str) -> str:
    import click

    choice = stdin_choice(value)
    if choice is None:
        raise click.BadParameter(f"takes a rank number, all or none, got {value.strip()!r}")
    return choice


def wanted(opt: cliopts.Opt) -> str:
    """What an option's value must be, in words: `a whole number of at least 1`."""
    most = f"{int(opt.maximum):,}" if opt.maximum is not None else None
    if opt.check in (cliopts.INT_MIN1, cliopts.INT_MIN0):
        least = 1 if opt.check == cliopts.INT_MIN1 else 0
        return f"a whole number from {least} to {most}" if most is not None else f"a whole number of at least {least}"
    if opt.check == cliopts.FLOAT_POS:
        return "a number of seconds above 0" + (f", at most {most}" if most is not None else "")
    if opt.check == cliopts.FLOAT_NONNEG:
        return "a number of seconds from 0" + (f" to {most}" if most is not None else "")
    return "one of " + ", ".join(opt.choices)


@functools.cache
def _plain(base: type, opt: cliopts.Opt) -> type:
    """click's type for the row, for plain ASCII numbers only (`-n ３` is not 3: int() reads any
    script's digits; `nan` is no number of seconds), failing in plain words: `takes a whole
    number of at least 1, got 'x'` (cli/parse.py puts the option as written before it)."""
    import math

    import click

    class Plain(base):  # type: ignore[misc, valid-type]
        def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
            try:
                if isinstance(value, str) and not value.isascii():
                    raise click.BadParameter("")
                converted = super().convert(value, param, ctx)
                if isinstance(converted, float) and not math.isfinite(converted):
                    raise click.BadParameter("")
            except click.BadParameter:
                self.fail(f"takes {wanted(opt)}, got {str(value)!r}", param, ctx)
            return converted

    Plain.__name__ = base.__name__
    return Plain


def click_option(opt: cliopts.Opt, **overrides: object):  # type: ignore[no-untyped-def]
    """The click option for one row of cliopts' table (overrides: e.g. a shorter help)."""
    import click

    kwargs: dict[str, object] = {"metavar": opt.metavar, "help": opt.help}
    if opt.kind == cliopts.FLAG:
        kwargs["is_flag"] = True
    if opt.kind in (cliopts.MULTI, cliopts.PAIRS, cliopts.ENV):
        kwargs["multiple"] = True
    if opt.kind == cliopts.PAIRS:
        kwargs["nargs"] = 2
    if opt.default is not None:
        kwargs["default"] = opt.default
    if opt.check == cliopts.CHOICE:
        kwargs["type"] = _plain(click.Choice, opt)(opt.choices, case_sensitive=False)
    elif opt.check == cliopts.RANK_CHOICE:
        kwargs["callback"] = _stdin_callback
    elif opt.check in (cliopts.INT_MIN1, cliopts.INT_MIN0):
        kwargs["type"] = _plain(click.IntRange, opt)(min=1 if opt.check == cliopts.INT_MIN1 else 0, max=opt.maximum)
    elif opt.check == cliopts.FLOAT_POS:
        kwargs["type"] = _plain(click.FloatRange, opt)(min=0, min_open=True, max=opt.maximum)
    elif opt.check == cliopts.FLOAT_NONNEG:
        kwargs["type"] = _plain(click.FloatRange, opt)(min=0, max=opt.maximum)
    kwargs.update(overrides)
    return click.Option([*opt.flags, opt.name], **kwargs)  # type: ignore[arg-type]


@functools.cache
def run_command():  # type: ignore[no-untyped-def]
    """The run command as click sees it, from every row of the table: for errors and job files."""
    import click

    params: list[click.Parameter] = [click_option(opt) for opt in cliopts.all_rows()]
    params.append(click.Argument(["argv"], nargs=-1, type=click.UNPROCESSED))
    return click.Command(
        "mpilaunch", params=params, add_help_option=False, context_settings={"allow_interspersed_args": False}
    )
