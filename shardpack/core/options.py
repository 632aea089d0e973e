"""Options as frozen dataclasses whose fields describe themselves.

A field made by :func:`option` carries in its metadata what a user reads about it (the help text),
how it is checked (choices, a range, a parser) and how the command line spells it (flag, metavar,
the default shown).  The dataclass's ``__post_init__`` calls :func:`check_fields`, so the Python
API and the command line check a value alike, and ``shardpack.cli.options`` builds the click
options from the same fields: an option is written down once.
"""

from __future__ import annotations

import dataclasses
import inspect

from shardpack.core.errors import ShardpackError

_MISSING = dataclasses.MISSING


def option(default, help: str, *, flag: str | None = None, choices: tuple | None = None,
           strict: bool = True, minimum: int | None = None, maximum: int | None = None,
           parse=None, noun: str | None = None, metavar: str | None = None,
           cli_default=None, flag_value=None, cli: bool = True,
           commands: tuple[str, ...] | None = None, **extra) -> dataclasses.Field:
    """A dataclass field with its documentation and checks in its metadata.

    Args:
        default: the value when the option is not given.
        help: the help text (the CLI's ``--help`` shows it).
        flag: the CLI flag; default ``--`` and the field name with dashes.
        choices: the values allowed (also the CLI's choices).
        strict: whether :func:`check_fields` refuses a value outside ``choices`` (False: the
            choices are the CLI's only).
        minimum: the smallest value allowed (an int option).
        maximum: the largest value allowed (an int option).
        parse: turns a given value into the field's value (``"256MB"`` -> 256000000); it raises
            a :class:`ShardpackError` for a value it cannot read.
        noun: what the option is called in "unknown NOUN" messages; default the flag.
        metavar: the CLI's name for the value.
        cli_default: the default as the CLI takes and shows it, where it differs.
        flag_value: the value a CLI flag without argument sets (``--skip-bad`` -> ``"skip"``).
        cli: whether the command line has the option at all.
        commands: the commands that take it; None: every command using the dataclass.
        **extra: further metadata for the dataclass's own use.
    """
    meta = dict(help=help, flag=flag, choices=None if choices is None else tuple(choices),
                strict=strict, minimum=minimum, maximum=maximum, parse=parse, noun=noun,
                metavar=metavar, cli_default=cli_default, flag_value=flag_value, cli=cli,
                commands=commands, **extra)
    return dataclasses.field(default=default, metadata=meta)


def flag_of(field: dataclasses.Field) -> str:
    """The CLI flag of ``field``: its ``flag`` metadata, else ``--`` and its name with dashes.

    Args:
        field: a field of an options dataclass.
    """
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def takes(field: dataclasses.Field, command: str | None) -> bool:
    """Whether ``command`` takes the option ``field`` (None: any command).

    Args:
        field: a field of an options dataclass.
        command: a command name, as the field's ``commands`` metadata names them.
    """
    commands = field.metadata.get("commands")
    return command is None or commands is None or command in commands


def check_fields(obj) -> None:
    """Parse and check every field of the frozen dataclass ``obj`` by its metadata, in place.

    Raises a one-line :class:`ShardpackError` naming the option for a value outside its choices
    or range.

    Args:
        obj: a dataclass instance whose fields were made by :func:`option`.
    """
    for field in dataclasses.fields(obj):
        meta = field.metadata
        value = getattr(obj, field.name)
        if value is None:
            continue
        if meta.get("parse") is not None:
            value = meta["parse"](value)
            object.__setattr__(obj, field.name, value)
        name = meta.get("noun") or flag_of(field)
        choices = meta.get("choices")
        if choices is not None and meta.get("strict", True) and value not in choices:
            raise ShardpackError(f"unknown {name} {value!r}: expected one of {choices}")
        _check_range(flag_of(field), value, meta.get("minimum"), meta.get("maximum"))


def _check_range(flag: str, value, minimum, maximum) -> None:
    if (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
        return
    if maximum is not None and minimum is not None:
        raise ShardpackError(f"{flag} must be in {minimum}..{maximum}, got {value!r}")
    if minimum == 1:
        raise ShardpackError(f"{flag} must be positive, got {value!r}")
    bound = f"at least {minimum}" if minimum is not None else f"at most {maximum}"
    raise ShardpackError(f"{flag} must be {bound}, got {value!r}")


def default_of(field: dataclasses.Field):
    """The default of ``field`` as a caller writes it (``cli_default`` where set: ``"256MB"``).

    Args:
        field: a field of an options dataclass.
    """
    shown = field.metadata.get("cli_default")
    return shown if shown is not None else field.default


def check_keywords(func, cls, command: str | None = None) -> None:
    """Fail at import when ``func``'s keyword arguments drift from the fields of ``cls``: each
    field ``command`` takes must be a keyword of ``func`` with the same default, so a function
    that spells its keywords out (for readers and IDEs) still has one source for them.

    Args:
        func: the function whose signature is checked.
        cls: the options dataclass.
        command: which fields count (their ``commands`` metadata); None: all.
    """
    params = inspect.signature(func).parameters
    for field in dataclasses.fields(cls):
        if not takes(field, command):
            continue
        param = params.get(field.name)
        if param is None or param.default != default_of(field):
            raise TypeError(f"{func.__qualname__}() must take {field.name}="
                            f"{default_of(field)!r} like {cls.__name__}.{field.name}")


def from_keywords(cls, keywords: dict, *, command: str | None = None, caller: str = "",
                  strict: bool = False):
    """An instance of the options dataclass ``cls`` from a function's keyword arguments.

    Args:
        cls: the options dataclass.
        keywords: name -> value; names that are not fields are left out, or with ``strict``
            refused.
        command: the command whose fields are taken (their ``commands`` metadata).
        caller: the function's name, for the TypeError of an unknown keyword.
        strict: refuse a keyword that is not a field ``command`` takes (as Python refuses an
            unexpected keyword argument).
    """
    names = {f.name for f in dataclasses.fields(cls) if takes(f, command)}
    if strict:
        unknown = sorted(set(keywords) - names)
        if unknown:
            raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    return cls(**{k: v for k, v in keywords.items() if k in names})


def keyword_signature(func, cls, command: str | None = None,
                      replacing: str = "options") -> inspect.Signature:
    """``func``'s signature with the fields of ``cls`` that ``command`` takes spelled out as
    keyword-only parameters (with their defaults) where its keyword-only parameter ``replacing``
    was; that parameter comes last, defaulting to None.  For ``help()`` and ``inspect``.

    Args:
        func: a function taking the options as one parameter.
        cls: the options dataclass.
        command: which fields are spelled out (their ``commands`` metadata); None: all.
        replacing: the name of ``func``'s options parameter.
    """
    signature = inspect.signature(func)
    params = list(signature.parameters.values())
    at = [p.name for p in params].index(replacing)
    params.pop(at)
    keyword = inspect.Parameter.KEYWORD_ONLY
    fields = [inspect.Parameter(f.name, keyword, default=default_of(f), annotation=f.type)
              for f in dataclasses.fields(cls) if takes(f, command)]
    last = inspect.Parameter(replacing, keyword, default=None,
                             annotation=f"{cls.__name__} | None")
    return signature.replace(parameters=params[:at] + fields + params[at:] + [last])
