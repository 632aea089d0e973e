"""The pytest plugin of the test suite (registered once, in tests/conftest.py): real servers on
127.0.0.1 (testbed/servers.py) and small source trees, as fixtures a test takes by name."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from testbed.helpers import fake_jpeg, make_tree
from testbed.servers import (
    DelayProxy, FaultServer, NginxServer, S3Server, ServerStartError, SpliceProxy, find_nginx,
)
from testbed.skips import REQUIRE_SERVERS, SkipAudit, skip_or_fail


def pytest_configure(config) -> None:
    """The skip audit (testbed/skips.py): registered always, it acts only where
    SHARDPACK_CI_SKIPS=1."""
    config.pluginmanager.register(SkipAudit(), "shardpack-skip-audit")


@pytest.fixture
def small_tree(tmp_path) -> Path:
    """An ImageFolder-like tree with odd names and an extra json field."""
    files = {
        "cat/0001.jpg": fake_jpeg(3000),
        "cat/0002.jpg": fake_jpeg(40),
        "cat/0002.json": b'{"w": 1}',
        "cat/with space.jpg": fake_jpeg(700),
        "dog/ünïcödé.jpg": fake_jpeg(1500),
        "dog/empty.jpg": fake_jpeg(32),
        "dog/empty.json": b"",  # a 0-byte sidecar: an empty field
        "dog/" + "long" * 40 + ".jpg": fake_jpeg(50),
    }
    return make_tree(tmp_path / "src", files)


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs (a disk that fills up), unmounted afterwards; skipped where mount fails."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


# --------------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------------

# s3_server is session-scoped, but every test module that imports the fixture gets its own copy
# of it from pytest; they share one rclone process through this reference count.
_shared_s3: dict[str, Any] = {"server": None, "users": 0}


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Server:
    """A running S3Server shared by the whole session. Use a bucket of your own per test
    (``s3_server.create_bucket()``). Skips only if rclone is missing or cannot run (fails
    instead under SHARDPACK_REQUIRE_SERVERS=1)."""
    if _shared_s3["server"] is None:
        server = S3Server(tmp_path_factory.mktemp("s3"))
        try:
            server.start()
        except ServerStartError as exc:
            if exc.exited:
                skip_or_fail(f"S3 test server (rclone serve s3) cannot start: {exc}",
                             REQUIRE_SERVERS)
            raise
        _shared_s3["server"] = server
    _shared_s3["users"] += 1
    try:
        yield _shared_s3["server"]
    finally:
        _shared_s3["users"] -= 1
        if _shared_s3["users"] == 0:
            _shared_s3["server"].stop()
            _shared_s3["server"] = None


def _starter(cls, started: list):
    """A factory that makes ``cls(*args, **kwargs)``, starts it and keeps it in ``started``."""
    def start(*args, **kwargs):
        server = cls(*args, **kwargs).start()
        started.append(server)
        return server
    return start


def _stop_all(started: list) -> None:
    errors = []
    for server in reversed(started):
        try:
            server.stop()
        except Exception as exc:  # stop the others anyway
            errors.append(exc)
    if errors:
        raise errors[0]


@pytest.fixture
def http_server(tmp_path_factory):
    """Factory: ``http_server(root_dir, extra_config="") -> NginxServer``, started; every server it
    started is stopped after the test. Skips if nginx is not installed (fails instead under
    SHARDPACK_REQUIRE_SERVERS=1)."""
    started: list[NginxServer] = []

    def start(root_dir: Path, **kwargs) -> NginxServer:
        binary = find_nginx()
        if binary is None:
            skip_or_fail("nginx is not installed "
                         "(scripts/setup.sh installs it: apt-get install nginx)", REQUIRE_SERVERS)
        server = NginxServer(root_dir, tmp_path_factory.mktemp("nginx"), binary=binary, **kwargs)
        server.start()
        started.append(server)
        return server

    yield start
    _stop_all(started)


@pytest.fixture
def delay_proxy():
    """Factory: ``delay_proxy(target_port, delay_s, target_host="127.0.0.1", connect_delay_s=0.0)
    -> DelayProxy``, started; stopped after the test."""
    started: list[DelayProxy] = []
    yield _starter(DelayProxy, started)
    _stop_all(started)


@pytest.fixture
def splice_proxy():
    """Factory: ``splice_proxy(target_port, delay_s, target_host="127.0.0.1") -> SpliceProxy``,
    started; stopped after the test."""
    started: list[SpliceProxy] = []
    yield _starter(SpliceProxy, started)
    _stop_all(started)


@pytest.fixture
def fault_server():
    """Factory: ``fault_server(root_dir, **mode) -> FaultServer`` (mode: FaultMode's fields),
    started; stopped after the test."""
    started: list[FaultServer] = []
    yield _starter(FaultServer, started)
    _stop_all(started)
