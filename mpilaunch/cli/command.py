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
        raise click.BadParameter(f"expected a rank number, all or none, not {value.strip().lower()!r}")
    return choice


@functools.cache
def _ascii(base: type) -> type:
    """click's range type, for plain ASCII numbers only: `-n ３` is not 3 (int() reads any
    script's digits), and `nan` is not a number of seconds (it is in no range to a comparison)."""
    import math

    class Plain(base):  # type: ignore[misc, valid-type]
        def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
            if isinstance(value, str) and not value.isascii():
                self.fail(f"{value!r} is not a plain (ASCII) number", param, ctx)
            converted = super().convert(value, param, ctx)
            if isinstance(converted, float) and not math.isfinite(converted):
                self.fail(f"{value!r} is not a finite number", param, ctx)
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
        kwargs["type"] = click.Choice(opt.choices, case_sensitive=False)
    elif opt.check == cliopts.RANK_CHOICE:
        kwargs["callback"] = _stdin_callback
    elif opt.check in (cliopts.INT_MIN1, cliopts.INT_MIN0):
        kwargs["type"] = _ascii(click.IntRange)(min=1 if opt.check == cliopts.INT_MIN1 else 0, max=opt.maximum)
    elif opt.check == cliopts.FLOAT_POS:
        kwargs["type"] = _ascii(click.FloatRange)(min=0, min_open=True, max=opt.maximum)
    elif opt.check == cliopts.FLOAT_NONNEG:
        kwargs["type"] = _ascii(click.FloatRange)(min=0, max=opt.maximum)
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
