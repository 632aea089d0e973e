"""shardpack's benchmarks: suites registered with :func:`benchmarks.registry.suite`, run through
one entry point.

    python -m benchmarks --list                          # the suites
    python -m benchmarks SUITE [--reps N] [--quick]      # run one; its JSON goes to results/
    python -m benchmarks ab --base REF SUITE...          # the same suites on REF and on this tree
    python -m benchmarks report                          # docs/benchmarks.md from results/*.json

Not part of the installed package (pyproject.toml installs shardpack* only). Nothing here is
imported by shardpack, and this package imports shardpack's public API, mostly inside the
functions that measure (so that a suite's child process, or a peer's venv, imports only what it
uses).
"""
