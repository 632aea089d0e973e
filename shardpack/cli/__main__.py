"""``python -m shardpack.cli``: the same as the ``shardpack`` command."""

from shardpack.cli.main import main

main()
