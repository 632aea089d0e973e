"""testbed/servers.py SpliceProxy behind nginx: exact bytes, the latency it adds, its throughput
against a direct connection, and clean ends (half-close, resets, stop) without leaked threads or
descriptors."""

from __future__ import annotations

import os
import socket
import statistics
import struct
import threading
import time

import fsspec
import pytest
import requests
import xxhash

from testbed.servers import NginxServer, ServerStartError, SpliceProxy, find_nginx, free_port
from testbed.skips import REQUIRE_SERVERS, skip_or_fail

BIG = 200 * 2**20


@pytest.fixture(scope="module")
def nginx(tmp_path_factory):
    """nginx over a folder with a 200 MiB file of random bytes and a small one; started and
    stopped by this module."""
    binary = find_nginx()
    if binary is None:
        skip_or_fail("nginx is not installed (scripts/setup.sh installs it: apt-get install nginx)",
                     REQUIRE_SERVERS)
    root = tmp_path_factory.mktemp("www")
    (root / "big.bin").write_bytes(os.urandom(BIG))
    (root / "small.bin").write_bytes(os.urandom(1000))
    with NginxServer(root, tmp_path_factory.mktemp("nginx"), binary=binary) as server:
        yield server


@pytest.fixture
def proxy():
    """Factory: a started SpliceProxy, stopped (and checked for leaks) after the test."""
    started: list[SpliceProxy] = []

    def start(port: int, delay_s: float) -> SpliceProxy:
        p = SpliceProxy(port, delay_s).start()
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()
        assert not p.errors, p.errors
    assert proxy_threads() == []


def proxy_threads() -> list[str]:
    """Every SpliceProxy thread running in this process (one accepting per proxy, two per
    connection)."""
    return [t.name for t in threading.enumerate() if t.name.startswith(SpliceProxy.name)]


def conn_threads() -> list[str]:
    return [name for name in proxy_threads() if not name.endswith("-accept")]


def open_fds() -> frozenset:
    """This process's open sockets and pipes, as (fd, what it points to)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed while listed
            continue
        if target.startswith(("socket:", "pipe:")):
            out.add((fd, target))
    return frozenset(out)


def no_new_fds(before: frozenset) -> bool:
    """No socket or pipe opened since ``before`` is still open, waiting up to 5 s for closes in
    flight.  Only new ones count: a test earlier in this process may close its own meanwhile."""
    return wait_for(lambda: not open_fds() - before)


def wait_for(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def file_bytes(nginx, name: str) -> bytes:
    return (nginx.root / name).read_bytes()


def digest_of(response: requests.Response) -> tuple[str, int]:
    h, n = xxhash.xxh3_128(), 0
    for chunk in response.iter_content(1 << 20):
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n


def raw_get(port: int, path: str, *, read: int | None = None, timeout: float = 10.0):
    """One GET over a plain socket, reading into a reused buffer: (seconds to the end of the
    body, bytes received, how it ended: 'eof' or 'reset'). ``read``: stop after this many bytes
    and return the still open socket in place of the ending."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    started = time.perf_counter()
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    buf, n = bytearray(1 << 20), 0
    try:
        while read is None or n < read:
            k = sock.recv_into(buf)
            if not k:
                break
            n += k
    except ConnectionResetError:
        sock.close()
        return time.perf_counter() - started, n, "reset"
    if read is not None:
        return time.perf_counter() - started, n, sock
    sock.close()
    return time.perf_counter() - started, n, "eof"


# --- exact bytes ----------------------------------------------------------------------------------

def test_bytes_through_the_proxy_are_the_same(nginx, proxy):
    p = proxy(nginx.port, 0.005)
    data = file_bytes(nginx, "big.bin")
    size = len(data)
    expected = (xxhash.xxh3_128(data).hexdigest(), size)
    with requests.Session() as session:
        for base in (nginx.url, p.url):
            with session.get(f"{base}/big.bin", stream=True, timeout=60) as r:
                assert r.status_code == 200
                assert digest_of(r) == expected
        ranges = [(0, 1), (1000, 2**20 + 17), (size // 2, size // 2 + 64 * 2**20),
                  (size - 5, size)]
        for start, end in ranges:
            header = {"Range": f"bytes={start}-{end - 1}"}
            direct = session.get(nginx.url_for("big.bin"), headers=header, timeout=60)
            proxied = session.get(p.url_for("big.bin"), headers=header, timeout=60)
            assert proxied.status_code == direct.status_code == 206
            assert proxied.headers["Content-Range"] == direct.headers["Content-Range"]
            assert proxied.content == direct.content == data[start:end]
        r = session.get(p.url_for("big.bin"), headers={"Range": "bytes=-100"}, timeout=60)
        assert r.content == data[-100:]

    fs = fsspec.filesystem("http", skip_instance_cache=True)
    url = p.url_for("big.bin")
    assert fs.size(url) == size
    for start, end in ranges:
        assert fs.cat_file(url, start=start, end=end) == data[start:end]
    starts = list(range(0, size, size // 37))[:30]
    got = fs.cat_ranges([url] * len(starts), starts, [s + 100_000 for s in starts])
    assert got == [data[s:s + 100_000] for s in starts]
    with fs.open(url, "rb", block_size=4 * 2**20) as f:
        f.seek(size - 10 * 2**20)
        assert f.read(3 * 2**20) == data[size - 10 * 2**20:size - 7 * 2**20]
    assert p.bytes_down > size and p.bytes_up > 0
    assert p.connections >= 2


# --- latency --------------------------------------------------------------------------------------

def test_each_request_waits_delay_s(nginx, proxy):
    delay = 0.05
    p = proxy(nginx.port, delay)
    expected = file_bytes(nginx, "small.bin")
    with requests.Session() as direct_session, requests.Session() as proxy_session:
        direct_session.get(nginx.url_for("small.bin"))  # connect, warm up the client
        direct, proxied = [], []
        for _ in range(6):
            started = time.perf_counter()
            direct_session.get(nginx.url_for("small.bin"))
            direct.append(time.perf_counter() - started)
            started = time.perf_counter()  # the first through the proxy also connects
            r = proxy_session.get(p.url_for("small.bin"))
            proxied.append(time.perf_counter() - started)
            assert r.content == expected
    assert all(t >= delay for t in proxied), proxied
    assert min(proxied) - min(direct) < delay + 0.25, (direct, proxied)  # nothing much more
    assert p.connections == 1  # keep-alive: one connection, one upstream connection


# --- throughput -----------------------------------------------------------------------------------

def test_throughput_is_a_good_fraction_of_direct(nginx, proxy, record_property):
    """A 200 MiB GET read into a reused buffer (a client as cheap as can be, so that the proxy
    shows), 5 times each way, alternating. Direct loopback here swings between ~2 and ~9 GB/s
    from one GET to the next (where the scheduler puts nginx and the client), the proxy much
    less (~1.1-2.5 GB/s on 2 cores): the median through the proxy must reach 0.2x the direct
    median, or 0.5 GB/s (loose: a loaded machine; the fastlink suite records it)."""
    p = proxy(nginx.port, 0.015)
    rates = {"direct": [], "proxy": []}
    for _ in range(5):
        for name, port in (("direct", nginx.port), ("proxy", p.port)):
            secs, n, how = raw_get(port, "/big.bin")
            assert how == "eof" and n > BIG
            rates[name].append(round(n / secs / 1e6))
    direct, proxied = statistics.median(rates["direct"]), statistics.median(rates["proxy"])
    record_property("mb_per_s", rates)
    print(f"200 MiB GET, median MB/s: direct {direct:.0f}, through SpliceProxy {proxied:.0f} "
          f"({proxied / direct:.2f}x); all: {rates}")
    # loose on purpose (a loaded 2-core machine): the benchmark records the real figure
    assert proxied >= 0.2 * direct or proxied >= 500, rates


# --- ends: half-close, resets, stop ---------------------------------------------------------------

def test_half_close_is_passed_on_and_nothing_leaks(nginx, proxy):
    p = proxy(nginx.port, 0.01)
    fds = open_fds()
    expected = file_bytes(nginx, "small.bin")
    with socket.create_connection(("127.0.0.1", p.port), timeout=5) as sock:
        sock.sendall(b"GET /small.bin HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive by default
        sock.shutdown(socket.SHUT_WR)  # nothing more to send: nginx answers, then closes
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert received.startswith(b"HTTP/1.1 200") and received.endswith(expected)
    assert wait_for(lambda: p.active == 0 and conn_threads() == [])
    assert no_new_fds(fds), open_fds() - fds


def test_client_reset_mid_body_ends_both_threads(nginx, proxy):
    p = proxy(nginx.port, 0.01)
    fds = open_fds()
    _, n, sock = raw_get(p.port, "/big.bin", read=256 * 1024)
    assert n >= 256 * 1024 and p.active == 1 and len(conn_threads()) == 2
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # a reset, with most of the body still coming
    assert wait_for(lambda: p.active == 0 and conn_threads() == [])
    assert no_new_fds(fds), open_fds() - fds


def test_target_reset_reaches_the_client(tmp_path, fault_server, proxy):  # noqa: F811
    (tmp_path / "a.bin").write_bytes(data := os.urandom(300_000))
    srv = fault_server(tmp_path, reset_after=100)
    p = proxy(srv.port, 0.01)
    fds = open_fds()
    with socket.create_connection(("127.0.0.1", p.port), timeout=5) as sock:
        sock.sendall(b"GET /a.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        received, how = b"", "eof"
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            how = "reset"
    assert how == "reset" and received.endswith(data[:100])
    assert wait_for(lambda: p.active == 0 and conn_threads() == [])
    assert no_new_fds(fds), open_fds() - fds


def test_target_down_resets_the_client(proxy):
    p = proxy(free_port(), 0.01)  # nothing listens there
    _, n, how = raw_get(p.port, "/x")
    assert n == 0 and how in ("reset", "eof")
    assert wait_for(lambda: p.active == 0 and conn_threads() == [])
    assert p.connections == 1


def test_stop_ends_every_connection_and_thread(nginx):
    fds = open_fds()
    p = SpliceProxy(nginx.port, 1.0).start()
    idle = socket.create_connection(("127.0.0.1", p.port), timeout=5)  # never sends
    held = socket.create_connection(("127.0.0.1", p.port), timeout=5)
    held.sendall(b"GET /small.bin HTTP/1.1\r\nHost: x\r\n\r\n")  # held for 1 s by the proxy
    p.delay_s = 0.0
    _, _, stalled = raw_get(p.port, "/big.bin", read=1)  # never reads the rest: writes block
    assert wait_for(lambda: p.active == 3 and len(conn_threads()) == 3 * 2)
    time.sleep(0.2)  # let the stalled one fill the socket buffers
    started = time.perf_counter()
    p.stop()
    assert time.perf_counter() - started < 5  # (bounded: nothing waits for the stalled reader)
    assert proxy_threads() == [] and p.active == 0
    for sock in (idle, held, stalled):
        try:
            sock.settimeout(5)
            while sock.recv(1 << 20):  # what was in flight, then the end
                pass
        except ConnectionResetError:
            pass
        sock.close()
    assert no_new_fds(fds), open_fds() - fds
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", p.port), timeout=1).close()
    p.stop()  # twice is fine
    with SpliceProxy(nginx.port, 0.0) as again:  # and a new one works at once
        assert raw_get(again.port, "/small.bin")[2] == "eof"
    assert proxy_threads() == []


def test_no_splice_is_a_start_error(monkeypatch):
    monkeypatch.delattr(os, "splice")
    with pytest.raises(ServerStartError):
        SpliceProxy(1, 0.0)


def test_proxy_in_the_url_helpers(nginx, proxy):
    p = proxy(nginx.port, 0.0)
    assert p.url == f"http://127.0.0.1:{p.port}"
    assert p.url_for("/sub dir/x.bin") == f"{p.url}/sub%20dir/x.bin"
