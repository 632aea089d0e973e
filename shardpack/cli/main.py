"""The ``shardpack`` command line: the group, its error handling and exit codes, the entry point.

Each command group lives in its own module over a Python function (``cli/pack.py``: pack,
convert, merge; ``cli/inspect.py``: info, ls, cat, verify, preview; ``cli/files.py``: unpack,
export; ``cli/cache.py``; ``cli/bench.py``).  Exit codes: 0 done, 1 ``verify`` found problems, 2
a :class:`~shardpack.core.errors.ShardpackError` (one line on stderr), 130 interrupted.
"""

from __future__ import annotations

import sys

import click

from shardpack.cli import bench, cache, files, inspect, pack
from shardpack.cli.common import flag_spelling
from shardpack.core.errors import ShardpackError
from shardpack.core.version import __version__


class ShardpackGroup(click.Group):
    """Turns every ShardpackError into one line on stderr and exit status 2, and Ctrl-C into
    one line and exit status 130."""

    def invoke(self, ctx):
        """Run the command; a ShardpackError or Ctrl-C ends it with one line.

        Args:
            ctx: the click context.
        """
        try:
            return super().invoke(ctx)
        except ShardpackError as exc:
            name = ctx.invoked_subcommand
            command = self.get_command(ctx, name) if name else None
            spell = flag_spelling(command, self.commands.values())
            click.echo(f"shardpack: error: {exc.render(spell)}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo(f"shardpack: interrupted{self._resume_hint(ctx)}", err=True)
            sys.exit(130)

    def _resume_hint(self, ctx) -> str:
        """For a command that can finish an interrupted run (pack, convert): how to, since the
        complete shards it wrote are kept for that."""
        name = ctx.invoked_subcommand
        command = self.get_command(ctx, name) if name else None
        if command is None or not any(p.name == "resume" for p in command.params):
            return ""
        return f"; to finish it, run the same `shardpack {name}` command again with --resume"


@click.group(cls=ShardpackGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shardpack")
def main():
    """Pack small files into large indexed shards and stream them into PyTorch training.

    \b
    Typical use:
      shardpack pack ~/data/train /fast/train-shards     # files -> shards + manifest
      shardpack info /fast/train-shards                  # what is in it
      shardpack verify /fast/train-shards                # re-hash and check every record
    """


# the order of `shardpack --help` is click's (by name)
for _module in (pack, files, inspect, bench, cache):
    for _command in _module.COMMANDS:
        main.add_command(_command)
