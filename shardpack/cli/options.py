"""Click options from the fields of an options dataclass.

:func:`click_options` turns each field made by :func:`shardpack.core.options.option` into a click
option with the field's flag, help text, choices, range, metavar and default, so a command's
options are never written out beside the dataclass that defines them.
"""

from __future__ import annotations

import dataclasses

import click

from shardpack.core.options import default_of, flag_of, takes


def click_option(field: dataclasses.Field):
    """The click option of one field of an options dataclass (its metadata: help, flag,
    choices, minimum and maximum, metavar, the default shown, the value of a flag).

    Args:
        field: a field made by :func:`shardpack.core.options.option`.
    """
    meta = field.metadata
    kwargs: dict = {"help": meta.get("help")}
    if meta.get("flag_value") is not None:  # --skip-bad: a flag setting a value
        kwargs.update(flag_value=meta["flag_value"], default=field.default)
    elif field.type in ("bool", bool):
        kwargs.update(is_flag=True, default=field.default)
    else:
        default = default_of(field)
        kwargs.update(default=default, show_default=default is not None)
        if meta.get("choices") is not None:
            kwargs["type"] = click.Choice(meta["choices"])
        elif meta.get("minimum") is not None or meta.get("maximum") is not None:
            kwargs["type"] = click.IntRange(meta.get("minimum"), meta.get("maximum"))
        if meta.get("metavar"):
            kwargs["metavar"] = meta["metavar"]
    return click.option(flag_of(field), field.name, **kwargs)


def click_options(cls, command: str | None = None):
    """Decorator: a click option for each field of the options dataclass ``cls`` that the
    command line has and ``command`` takes, in field order.

    Args:
        cls: the options dataclass.
        command: the command (the fields' ``commands`` metadata); None: every field.
    """
    chosen = [f for f in dataclasses.fields(cls) if f.metadata.get("cli", True)
              and takes(f, command)]

    def wrap(fn):
        for field in reversed(chosen):
            fn = click_option(field)(fn)
        return fn
    return wrap
