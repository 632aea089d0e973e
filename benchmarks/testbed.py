"""The one place where the benchmarks reach the test suite's machinery: real servers on
127.0.0.1 (nginx, the latency proxies, rclone's S3, the misbehaving HTTP server) and the small
dataset builders the fault campaign shares with the fault tests.

Each accessor imports on call, so a suite that needs none of it never imports tests/. When the
servers and builders move out of tests/ into a package of their own, only this module changes.
"""

from __future__ import annotations


def servers():
    """tests/servers.py: NginxServer, DelayProxy, SpliceProxy, S3Server, FaultServer,
    find_nginx."""
    from tests import servers as module
    return module


def make_tree(root, files):
    """tests/conftest.py's ``make_tree``: write ``files`` ({relative path: bytes}) under
    ``root``; returns ``root``.

    Args:
        root: the folder.
        files: what to write in it.
    """
    from tests.conftest import make_tree as make
    return make(root, files)


def fake_jpeg(size, seed=None) -> bytes:
    """tests/conftest.py's ``fake_jpeg``: bytes that pass the quick image check.

    Args:
        size: how many bytes.
        seed: varies the content.
    """
    from tests.conftest import fake_jpeg as make
    return make(size, seed=seed)


def read_tree(root) -> dict:
    """tests/conftest.py's ``read_tree``: {relative path: bytes} of every file under ``root``.

    Args:
        root: the folder.
    """
    from tests.conftest import read_tree as read
    return read(root)


def craft(*args, **kwargs):
    """tests/test_crafted.py's ``craft``: a one-shard dataset holding exactly the given samples,
    every hash consistent.

    Args:
        *args: ``craft``'s positional arguments (folder, samples, format, name).
        **kwargs: its keyword arguments.
    """
    from tests.test_crafted import craft as make
    return make(*args, **kwargs)


def faults():
    """tests/faults.py: the corruption campaign's reads and outcomes and the manifest sweep
    (shared with tests/test_integrity.py, which holds verify to the same sweep)."""
    from tests import faults as module
    return module


def preload() -> None:
    """Import what the fault campaign's tries use from tests/ before the first fork."""
    import tests.servers  # noqa: F401
    import tests.test_crafted  # noqa: F401
