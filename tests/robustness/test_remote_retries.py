"""One retry policy for every remote kind: a refused, reset or timed-out connection over http://
is retried like one over s3://, within the request deadline (docs/remote.md, "Reliability"),
through a real nginx restarted under an epoch and a real closed port on 127.0.0.1."""

import os
import socket
import threading
import time

import pytest

import shardpack
from shardpack import ShardDataset
from shardpack.core.errors import DatasetNotFoundError, RemoteError
from shardpack.read.reader import DatasetReader
from shardpack.storage import RetryPolicy, Storage, StorageOptionError

from testbed.helpers import make_tree, run_cli
from testbed.servers import free_port

N = 120  # 10 shards of 12: most of them are read after the restart


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("retries")
    files = {f"c{i % 3}/{i:03d}.bin": os.urandom(2000 + 37 * i) for i in range(N)}
    shardpack.pack(make_tree(root / "src", files), root / "ds", max_samples=12, workers=1)
    return root / "ds"


def _policy(monkeypatch, policy: RetryPolicy) -> None:
    """Every Storage the test makes (a dataset's included) retries by ``policy``."""
    original = Storage.__init__

    def init(self, url, storage_options=None, retry=None):
        original(self, url, storage_options, retry or policy)

    monkeypatch.setattr(Storage, "__init__", init)


def _refused(port: int) -> bool:
    """Whether nginx is down: a connection refused, or reset by a server closing its listening
    socket with this connection still in its backlog (the probe, not the dataset, met that)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    return False


@pytest.mark.parametrize("cached", [False, True])
def test_nginx_restarted_mid_epoch(local_ds, http_server, monkeypatch, tmp_path, cached):
    """nginx stopped after the first shard (its connections cut), down for 0.5 s, started again
    on the same port: the epoch goes on, every sample once, bytes as packed."""
    # many short waits: a budget of seconds, far more than the 0.5 s down, whatever the jitter
    _policy(monkeypatch, RetryPolicy(attempts=60, base_delay=0.05, max_delay=0.2, timeout=5.0))
    truth = {s["__key__"]: bytes(s["bin"]) for s in DatasetReader(local_ds)}
    server = http_server(local_ds)
    ds = ShardDataset(server.url, shuffle=False, cache_dir=tmp_path / "c" if cached else None)
    got, reached, failed = [], threading.Event(), []

    def epoch():  # (in a thread: nginx is restarted from the main thread, which started it)
        try:
            for sample in ds:
                got.append((sample["__key__"], bytes(sample["bin"])))
                if len(got) == 12:
                    reached.set()
                    deadline = time.monotonic() + 10
                    while not _refused(server.port) and time.monotonic() < deadline:
                        time.sleep(0.01)  # read on only once nginx is down
        except Exception as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)
        finally:
            reached.set()

    reader = threading.Thread(target=epoch)
    reader.start()
    assert reached.wait(60)
    server.restart(down_s=0.5)
    reader.join(120)
    assert not reader.is_alive() and not failed, failed
    assert len(got) == N and dict(got) == truth  # every sample exactly once, bytes as packed
    assert ds.reader.storage.stats["retries"] >= 1  # the restart was met, and retried


def test_refused_connection_is_retried_as_the_policy_says(tmp_path):
    """A closed port on 127.0.0.1: each request is attempted RetryPolicy.attempts times, then
    one line naming the URL, what happened and what to do; not retried: a 404."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/ds"
    storage = Storage(url, retry=RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.02))
    requests = 0
    for what, call in [("read", lambda: storage.read_bytes("shardpack.json")),
                       ("read", lambda: storage.read_ranges([("shard-00000.tar", 0, 10)])),
                       ("exists", lambda: storage.exists("shardpack.json")),
                       ("size", lambda: storage.size("shardpack.json"))]:
        with pytest.raises(RemoteError) as info:
            call()
        requests += 4
        assert storage.stats["requests"] == requests
        text = str(info.value)
        assert text.startswith(f"{url}/") and len(text.splitlines()) == 1
        assert f"{what} failed after 4 attempt(s): ClientConnectorError: Cannot connect" in text
        assert "and 4 attempts, all the retry policy allows: check that the server is up and " \
               "reachable, or allow more: storage option retry_attempts)" in text


def test_request_deadline_ends_the_retries(tmp_path):
    """Attempts to spare, but the request deadline bounds the request, its waits included."""
    url = f"http://127.0.0.1:{free_port()}/ds"
    storage = Storage(url, {"request_deadline": 0.3},
                      retry=RetryPolicy(attempts=100000, base_delay=0.02, max_delay=0.05))
    with pytest.raises(RemoteError, match=r"shardpack.json: read failed after \d+ attempt\(s\): "
                                          r"ClientConnectorError: .* at the request deadline, "
                                          r"storage option request_deadline: .* raise it\)$"):
        storage.read_bytes("shardpack.json")
    assert 1 < storage.stats["requests"] < 100000  # retried, and ended by the deadline


def test_not_found_is_not_retried(local_ds, http_server):
    server = http_server(local_ds)
    storage = Storage(server.url, retry=RetryPolicy(attempts=4, base_delay=0.01))
    with pytest.raises(DatasetNotFoundError, match="file is missing"):
        storage.read_bytes("no-such.tar")
    assert storage.stats["requests"] == 1 and server.requests_for("no-such.tar") == 1
    assert storage.exists("shardpack.json") is True and storage.exists("no-such.tar") is False
    assert storage.stats["retries"] == 0


def test_retry_attempts_storage_option(tmp_path):
    """storage option retry_attempts (-o retry_attempts=N) sets a dataset's or the CLI's
    attempts, where no RetryPolicy can be passed; a bad value is refused in one line."""
    url = f"http://127.0.0.1:{free_port()}/ds"
    storage = Storage(url, {"retry_attempts": 2}, retry=RetryPolicy(base_delay=0.01))
    with pytest.raises(RemoteError, match=r"read failed after 2 attempt\(s\): "):
        storage.read_bytes("shardpack.json")
    assert storage.stats["requests"] == 2
    result = run_cli("info", url, "-o", "retry_attempts=2", ok=None)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "failed after 2 attempt(s): ClientConnectorError" in result.output
    for bad in (0, -1, 1.5, "3", True):
        with pytest.raises(StorageOptionError, match="retry_attempts must be a whole number"):
            Storage(url, {"retry_attempts": bad})


def test_s3_refused_endpoint_same_policy():
    """The same policy over s3:// (no server needed: a closed endpoint port): as many attempts
    as over http://, the same one line, the same deadline."""
    endpoint = {"endpoint_url": f"http://127.0.0.1:{free_port()}", "key": "k", "secret": "s"}
    storage = Storage("s3://bucket/ds", endpoint,
                      retry=RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02))
    with pytest.raises(RemoteError, match=r"^s3://bucket/ds/shardpack.json: read failed after 3 "
                                          r"attempt\(s\): EndpointConnectionError: .* all the "
                                          r"retry policy allows"):
        storage.read_bytes("shardpack.json")
    assert storage.stats["requests"] == 3
    storage = Storage("s3://bucket/ds", {**endpoint, "request_deadline": 0.5},
                      retry=RetryPolicy(attempts=100000, base_delay=0.01, max_delay=0.02))
    with pytest.raises(RemoteError, match=r"at the request deadline, storage option "
                                          r"request_deadline"):
        storage.read_bytes("shardpack.json")
    assert storage.stats["requests"] < 100000
