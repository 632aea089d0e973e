"""The benchmarks' way to the top-level ``testbed`` package, which they share with the tests:
real servers on 127.0.0.1 (nginx, the latency proxies, rclone's S3, the misbehaving HTTP server)
and the small dataset builders the fault campaign shares with the fault tests.

Each accessor imports on call, so a suite that needs none of it never imports the servers.
"""

from __future__ import annotations


def servers():
    """testbed/servers.py: NginxServer, DelayProxy, SpliceProxy, S3Server, FaultServer,
    find_nginx."""
    from testbed import servers as module
    return module


def make_tree(root, files):
    """testbed/helpers.py's ``make_tree``: write ``files`` ({relative path: bytes}) under
    ``root``; returns ``root``.

    Args:
        root: the folder.
        files: what to write in it.
    """
    from testbed.helpers import make_tree as make
    return make(root, files)


def fake_jpeg(size, seed=None) -> bytes:
    """testbed/helpers.py's ``fake_jpeg``: bytes that pass the quick image check.

    Args:
        size: how many bytes.
        seed: varies the content.
    """
    from testbed.helpers import fake_jpeg as make
    return make(size, seed=seed)


def read_tree(root) -> dict:
    """testbed/helpers.py's ``read_tree``: {relative path: bytes} of every file under ``root``.

    Args:
        root: the folder.
    """
    from testbed.helpers import read_tree as read
    return read(root)


def craft(*args, **kwargs):
    """testbed/crafted.py's ``craft``: a one-shard dataset holding exactly the given samples,
    every hash consistent.

    Args:
        *args: ``craft``'s positional arguments (folder, samples, format, name).
        **kwargs: its keyword arguments.
    """
    from testbed.crafted import craft as make
    return make(*args, **kwargs)


def faults():
    """testbed/faults.py: the corruption campaign's reads and outcomes and the manifest sweep
    (shared with tests/robustness/test_integrity.py, which holds verify to the same sweep)."""
    from testbed import faults as module
    return module


def preload() -> None:
    """Import what the fault campaign's tries use from testbed before the first fork."""
    import testbed.crafted  # noqa: F401
    import testbed.servers  # noqa: F401
