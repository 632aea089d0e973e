"""What every command shares: the ``-o`` storage options, ``-q``, the progress rule, and how a
summary is printed."""

from __future__ import annotations

import json
import sys

import click

from shardpack.core.errors import ShardpackError


def parse_storage_options(pairs) -> dict:
    """``-o key=value`` pairs -> fsspec storage_options; dotted keys nest
    (``client_kwargs.endpoint_url=http://127.0.0.1:8333``); values are JSON when they parse.

    Args:
        pairs: the ``KEY=VALUE`` texts, as click gives them.
    """
    options: dict = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ShardpackError(f"storage option {pair!r} is not KEY=VALUE")
        try:
            value = json.loads(value)
        except ValueError:
            pass
        node = options
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return options


def flag_spelling(command: click.Command | None, others=()):
    """``spell(name, value)`` for :meth:`ShardpackError.render`: an option an error names, as
    ``command`` spells it (``on_error="skip"`` -> ``--skip-bad``, ``group="image"`` ->
    ``--group image``), from the command's own click options.  An option the command lacks is
    spelled as the first of ``others`` that has it spells it (``--name value`` if none).

    Args:
        command: the click command that ran, or None.
        others: the other commands, looked at for an option ``command`` lacks.
    """
    params: dict = {}
    for cmd in reversed([c for c in (command, *others) if c is not None]):
        params.update((p.name, p) for p in cmd.params if isinstance(p, click.Option))

    def spell(name: str, value) -> str:
        param = params.get(name)
        flag = param.opts[0] if param is not None else "--" + name.replace("_", "-")
        if value is True or (param is not None and param.is_flag
                             and param.flag_value == value):
            return flag
        return f"{flag} {value}"
    return spell


def show_progress(quiet: bool) -> bool:
    """Whether a command shows its progress bar: not with ``-q``, and only on a terminal.

    Args:
        quiet: the command's ``--quiet``.
    """
    return not quiet and sys.stderr.isatty()


storage_option = click.option(
    "-o", "--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
    help="fsspec storage option for remote paths, repeatable; dotted keys nest, e.g. "
         "-o client_kwargs.endpoint_url=http://127.0.0.1:8333 -o key=ID -o secret=KEY. "
         "S3 credentials and endpoint also come from the usual AWS_* variables.")

quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress bar.")


def echo_summary(summary) -> None:
    """Print a run's summary: its report lines (skips, notes) on stderr, its summary line on
    stdout.

    Args:
        summary: a PackSummary, ExportSummary or the like (``line()``, and ``report_lines()`` or
            ``first_skips`` and ``notes``).
    """
    if hasattr(summary, "report_lines"):
        lines = summary.report_lines()
    else:
        lines = ([f"skipped: {line}" for line in summary.first_skips[:10]]
                 + [f"note: {line}" for line in getattr(summary, "notes", [])])
    for line in lines:
        click.echo(line, err=True)
    click.echo(summary.line())
