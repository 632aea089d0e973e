"""Self-tests of testbed/servers.py: each test server does what its fixture promises."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fsspec
import pytest
import requests

from testbed.servers import DelayProxy, FaultMode, FaultServer, parse_range


@pytest.fixture
def www(tmp_path) -> tuple[Path, dict[str, bytes]]:
    """A folder to serve: a few files, one in a folder with a space in its name."""
    root = tmp_path / "www"
    files = {"a.bin": os.urandom(300_000), "sub dir/b.bin": os.urandom(1000), "empty.bin": b""}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root, files


def raw_get(port: int, path: str, headers: str = "", timeout: float = 5.0) -> tuple[bytes, str]:
    """One GET over a plain socket; returns (all bytes received, how the connection ended:
    'eof' or 'reset')."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n"
                     .encode())
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            return received, "reset"
        return received, "eof"


# --- nginx ----------------------------------------------------------------------------------------

def test_nginx_serves_ranges_and_counts_requests(http_server, www):
    root, files = www
    srv = http_server(root)
    data = files["a.bin"]
    url = srv.url_for("a.bin")

    r = requests.get(url, headers={"Range": "bytes=1000-1999"})
    assert r.status_code == 206 and r.content == data[1000:2000]
    assert r.headers["Content-Range"] == f"bytes 1000-1999/{len(data)}"
    r = requests.get(url, headers={"Range": "bytes=-10"})
    assert r.status_code == 206 and r.content == data[-10:]
    r = requests.get(url)
    assert r.status_code == 200 and r.content == data and r.headers["Accept-Ranges"] == "bytes"
    assert requests.head(url).headers["Content-Length"] == str(len(data))
    assert requests.get(srv.url_for("sub dir/b.bin")).content == files["sub dir/b.bin"]
    assert requests.get(srv.url_for("missing.bin")).status_code == 404

    assert srv.requests_for("a.bin") == 4
    assert srv.requests_for("/a.bin", method="GET") == 3
    assert srv.requests_for("sub dir/b.bin") == 1
    first = srv.requests("a.bin")[0]
    assert (first["method"], first["status"], first["bytes"], first["range"]) == \
        ("GET", 206, 1000, "bytes=1000-1999")
    assert srv.bytes_sent("a.bin") == 1000 + 10 + len(data)


def test_nginx_with_fsspec_http(http_server, www):
    root, files = www
    srv = http_server(root)
    data = files["a.bin"]
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    assert fs.cat_file(srv.url_for("a.bin"), start=12345, end=23456) == data[12345:23456]
    with fs.open(srv.url_for("a.bin"), "rb", block_size=4096) as f:
        f.seek(250_000)
        assert f.read(100) == data[250_000:250_100]
    assert any(e["status"] == 206 for e in srv.requests("a.bin"))


def test_nginx_stops(http_server, www):
    srv = http_server(www[0])
    proc, port = srv.proc, srv.port
    srv.stop()
    assert proc.poll() is not None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


# --- delay proxy ----------------------------------------------------------------------------------

def test_delay_proxy_adds_the_delay_each_way(fault_server, delay_proxy, www):
    root, files = www
    srv = fault_server(root)
    delay = 0.05
    proxy = delay_proxy(srv.port, delay)
    with requests.Session() as session:
        session.get(srv.url_for("sub dir/b.bin"))  # warm up the client
        started = time.perf_counter()
        session.get(srv.url_for("sub dir/b.bin"))
        direct = time.perf_counter() - started

        timings = []
        for _ in range(2):  # a new connection, then the same connection again (keep-alive)
            started = time.perf_counter()
            r = session.get(f"{proxy.url}/sub%20dir/b.bin")
            timings.append(time.perf_counter() - started)
            assert r.content == files["sub dir/b.bin"]
    assert all(t >= 2 * delay for t in timings), timings
    assert all(t < 2 * delay + 0.5 for t in timings), timings
    assert direct < delay
    assert proxy.connections == 1
    assert proxy.bytes_down > 2 * len(files["sub dir/b.bin"])
    assert proxy.bytes_up > 0


def test_delay_proxy_connect_delay(fault_server, delay_proxy, www):
    srv = fault_server(www[0])
    proxy = delay_proxy(srv.port, 0.01, connect_delay_s=0.1)
    started = time.perf_counter()
    body, how = raw_get(proxy.port, "/empty.bin")
    assert time.perf_counter() - started >= 0.1 + 2 * 0.01
    assert body.startswith(b"HTTP/1.1 200") and how == "eof"


def test_delay_proxy_many_connections_in_order(fault_server, delay_proxy, tmp_path):
    (tmp_path / "big.bin").write_bytes(big := os.urandom(4 * 2**20))
    srv = fault_server(tmp_path)
    delay = 0.05
    proxy = delay_proxy(srv.port, delay)
    url = f"{proxy.url}/big.bin"

    def fetch(i):  # a connection of its own, a different 128 KiB each
        with requests.Session() as s:
            return s.get(url, headers={"Range": f"bytes={i}-{i + 2**17 - 1}"}).content

    count = 24
    started = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        bodies = list(pool.map(fetch, range(0, count * 1000, 1000)))
    elapsed = time.perf_counter() - started
    assert bodies == [big[i:i + 2**17] for i in range(0, count * 1000, 1000)]
    assert proxy.connections == count
    # In parallel, not one connection after the other (which takes >= count * 2 * delay = 2.4 s).
    assert elapsed < count * 2 * delay / 2, elapsed

    # Order is kept over a long stream of chunks, each delayed on its own.
    proxy.delay_s = 0.002
    assert hashlib.sha256(requests.get(url).content).digest() == hashlib.sha256(big).digest()
    assert proxy.bytes_down > len(big) + count * 2**17
    deadline = time.monotonic() + 2
    while proxy.active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.active == 0


def test_delay_proxy_passes_resets_on_and_stops_cleanly(fault_server, www):
    root, files = www
    srv = fault_server(root, reset_after=100)
    with DelayProxy(srv.port, 0.01) as proxy:
        body, how = raw_get(proxy.port, "/a.bin")
        assert how == "reset"
        assert body.endswith(files["a.bin"][:100])
        # a connection left open is closed by stop()
        idle = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    try:
        assert idle.recv(10) == b""  # the proxy closed it
    except ConnectionResetError:
        pass
    finally:
        idle.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()


# --- fault server ---------------------------------------------------------------------------------

def test_parse_range():
    assert parse_range("bytes=0-9", 100) == (0, 10)
    assert parse_range("bytes=90-", 100) == (90, 100)
    assert parse_range("bytes=90-200", 100) == (90, 100)
    assert parse_range("bytes=-10", 100) == (90, 100)
    assert parse_range("bytes=-200", 100) == (0, 100)
    assert parse_range("bytes=100-", 100) == "unsatisfiable"
    assert parse_range("bytes=-0", 100) == "unsatisfiable"
    for ignored in ("bytes=5-1", "items=0-1", "bytes=0-1,5-6", "bytes=x-1", "bytes 0-1"):
        assert parse_range(ignored, 100) is None, ignored


def test_fault_server_serves_ranges(fault_server, www):
    root, files = www
    srv = fault_server(root)
    data = files["a.bin"]
    with requests.Session() as session:  # all on one keep-alive connection
        r = session.get(srv.url_for("a.bin"), headers={"Range": "bytes=299990-"})
        assert r.status_code == 206 and r.content == data[299990:]
        assert r.headers["Content-Range"] == f"bytes 299990-299999/{len(data)}"
        r = session.get(srv.url_for("a.bin"), headers={"Range": "bytes=10-19"})
        assert r.status_code == 206 and r.content == data[10:20]
        r = session.get(srv.url_for("a.bin"))
        assert r.status_code == 200 and r.content == data and r.headers["Accept-Ranges"] == "bytes"
        r = session.get(srv.url_for("a.bin"), headers={"Range": f"bytes={len(data)}-"})
        assert r.status_code == 416 and r.headers["Content-Range"] == f"bytes */{len(data)}"
        assert session.head(srv.url_for("a.bin")).headers["Content-Length"] == str(len(data))
        assert session.get(srv.url_for("sub dir/b.bin")).content == files["sub dir/b.bin"]
        assert session.get(srv.url_for("empty.bin")).content == b""
        assert session.get(srv.url_for("missing")).status_code == 404
        assert session.get(f"{srv.url}/../../etc/passwd").status_code == 404
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    assert fs.cat_file(srv.url_for("a.bin"), start=5, end=50_005) == data[5:50_005]
    assert srv.requests_for("a.bin", method="GET") >= 5
    assert srv.requests_for("/sub dir/b.bin") == 1
    assert [r.status for r in srv.requests[:4]] == [206, 206, 200, 416]
    assert not srv.errors


def test_fault_server_503_then_ok(fault_server, www):
    root, files = www
    srv = fault_server(root, status=503, retry_after=2, times=2)
    for _ in range(2):
        r = requests.get(srv.url_for("a.bin"), headers={"Range": "bytes=0-9"})
        assert r.status_code == 503 and r.headers["Retry-After"] == "2"
    r = requests.get(srv.url_for("a.bin"), headers={"Range": "bytes=0-9"})
    assert r.status_code == 206 and r.content == files["a.bin"][:10]
    # `times` counts per path: another path gets its own two failures
    assert requests.get(srv.url_for("sub dir/b.bin")).status_code == 503
    assert srv.requests_for("a.bin") == 3
    assert [r.faulted for r in srv.requests] == [True, True, False, True]


def test_fault_server_status_codes_and_path_filter(fault_server, www):
    root, files = www
    srv = fault_server(root, status=403, only=["sub dir/*"])
    assert requests.get(srv.url_for("sub dir/b.bin")).status_code == 403
    assert requests.head(srv.url_for("sub dir/b.bin")).status_code == 403
    assert requests.get(srv.url_for("a.bin")).content == files["a.bin"]
    srv.set_mode(status=404)
    assert requests.get(srv.url_for("a.bin")).status_code == 404
    srv.set_mode()  # behave again
    assert requests.get(srv.url_for("a.bin")).status_code == 200


def test_fault_server_reset_mid_body(fault_server, www):
    root, files = www
    srv = fault_server(root, reset_after=5000, times=1)
    body, how = raw_get(srv.port, "/a.bin")
    assert how == "reset"
    head, _, partial = body.partition(b"\r\n\r\n")
    assert b"Content-Length: 300000" in head and partial == files["a.bin"][:5000]
    srv.set_mode(reset_after=5000)
    with pytest.raises((requests.exceptions.ConnectionError,
                        requests.exceptions.ChunkedEncodingError)):
        requests.get(srv.url_for("a.bin"))
    assert requests.head(srv.url_for("a.bin")).status_code == 200  # HEAD has no body to cut


def test_fault_server_hang_times_out(fault_server, www):
    srv = fault_server(www[0], hang=True)
    started = time.perf_counter()
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.get(srv.url_for("a.bin"), timeout=(1, 0.3))
    assert time.perf_counter() - started < 2
    assert srv.requests_for("a.bin") == 1 and srv.requests[0].status is None


def test_fault_server_drip_and_delay(fault_server, www):
    root, files = www
    srv = fault_server(root, drip_bps=20_000)
    started = time.perf_counter()
    r = requests.get(srv.url_for("a.bin"), headers={"Range": "bytes=0-5999"})
    assert r.content == files["a.bin"][:6000]
    assert time.perf_counter() - started >= 0.25  # 6000 B at 20 kB/s: 0.3 s
    srv.set_mode(delay_s=0.2)
    started = time.perf_counter()
    assert requests.get(srv.url_for("sub dir/b.bin")).content == files["sub dir/b.bin"]
    assert time.perf_counter() - started >= 0.2


def test_fault_server_ignore_range(fault_server, www):
    root, files = www
    srv = fault_server(root, ignore_range=True)
    r = requests.get(srv.url_for("a.bin"), headers={"Range": "bytes=0-9"})
    assert r.status_code == 200 and r.content == files["a.bin"]
    assert "Accept-Ranges" not in r.headers
    assert "Accept-Ranges" not in requests.head(srv.url_for("a.bin")).headers


def test_fault_server_mode_is_validated(www):
    with pytest.raises(TypeError):
        FaultServer(www[0], no_such_fault=True)
    assert not FaultMode().misbehaves


# --- S3 -------------------------------------------------------------------------------------------

def test_s3_put_then_read_a_range(s3_server):
    assert s3_server.startup_s is not None and s3_server.startup_s < 10
    bucket = s3_server.create_bucket()
    fs = s3_server.filesystem()
    data = os.urandom(200_000)
    fs.pipe_file(f"{bucket}/dir/x.bin", data)
    assert fs.cat_file(f"{bucket}/dir/x.bin", start=1000, end=2000) == data[1000:2000]
    with fs.open(f"{bucket}/dir/x.bin", "rb", block_size=10_000) as f:  # sends If-Match: <ETag>
        f.seek(150_000)
        assert f.read(10) == data[150_000:150_010]
    assert fs.info(f"{bucket}/dir/x.bin")["size"] == len(data)
    assert s3_server.requests_for(f"{bucket}/dir/x.bin") == 2  # GET
    assert s3_server.requests_for(f"{bucket}/dir/x.bin", method="PUT") == 1
    assert s3_server.requests_for(f"{bucket}/dir/x.bin", method=None) >= 3


def test_s3_storage_options_and_env(s3_server, monkeypatch, tmp_path):
    bucket = s3_server.create_bucket()
    (tmp_path / "up" / "sub").mkdir(parents=True)
    (tmp_path / "up" / "one.bin").write_bytes(b"one")
    (tmp_path / "up" / "sub" / "two.bin").write_bytes(b"two")
    assert s3_server.upload_dir(tmp_path / "up", bucket, "pre") == [
        f"{bucket}/pre/one.bin", f"{bucket}/pre/sub/two.bin"]
    with fsspec.open(f"s3://{bucket}/pre/sub/two.bin", "rb", **s3_server.storage_options) as f:
        assert f.read() == b"two"
    # files put straight into the data folder are served once rclone's 1 s dir cache expires
    (s3_server.data_dir / bucket / "direct.bin").write_bytes(b"direct")
    time.sleep(1.2)
    assert s3_server.filesystem().cat_file(f"{bucket}/direct.bin") == b"direct"
    # the environment variables alone are enough for boto-based code (e.g. in a subprocess)
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    import s3fs
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    assert fs.cat_file(f"{bucket}/pre/one.bin", start=1, end=3) == b"ne"


def test_s3_through_delay_proxy(s3_server, delay_proxy):
    bucket = s3_server.create_bucket()
    data = os.urandom(50_000)
    s3_server.filesystem().pipe_file(f"{bucket}/x.bin", data)
    delay = 0.03
    proxy = delay_proxy(s3_server.port, delay)
    fs = s3_server.filesystem(endpoint_url=proxy.url)
    fs.cat_file(f"{bucket}/x.bin", start=0, end=1)  # connect
    started = time.perf_counter()
    assert fs.cat_file(f"{bucket}/x.bin", start=100, end=300) == data[100:300]
    assert time.perf_counter() - started >= 2 * delay
    assert proxy.connections >= 1 and proxy.bytes_down > 200
    assert s3_server.requests_for(f"{bucket}/x.bin") == 2


@pytest.mark.slow
def test_s3_multipart_upload(s3_server):
    bucket = s3_server.create_bucket()
    fs = s3_server.filesystem()
    data = os.urandom(11 * 2**20)
    with fs.open(f"{bucket}/big.bin", "wb", block_size=5 * 2**20) as f:  # 3 parts
        f.write(data)
    start = 6 * 2**20 - 5
    assert fs.cat_file(f"{bucket}/big.bin", start=start, end=start + 10) == data[start:start + 10]
    assert s3_server.requests_for(f"{bucket}/big.bin", method="PUT") == 1
