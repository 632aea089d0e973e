"""The ``shardpack`` command line, one module per command group over a Python function."""

from shardpack.cli.main import main

__all__ = ["main"]
