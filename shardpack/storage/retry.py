"""Retries of remote requests: the policy, which failures are worth another attempt, and the
errors the bounded request path raises (shardpack/storage/http.py)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and full jitter, for remote requests only.

    Args:
        attempts: tries of one request, the first included.
        base_delay: seconds before the second try (doubled each try, jittered).
        max_delay: the longest wait between tries.
        timeout: seconds per request (connect, and between reads).
    """

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 10.0
    timeout: float = 30.0  # seconds per request (connect, and between reads)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before the try after ``attempt`` (0-based).

        Args:
            attempt: the try that failed.
            retry_after: the server's Retry-After in seconds, if it sent one (honoured up to
                three times ``max_delay``).
        """
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay * 3)
        return random.uniform(0, min(self.max_delay, self.base_delay * 2 ** attempt))


class ShortReadError(OSError):
    """A read returned fewer bytes than asked or than the manifest records (a connection cut
    mid-body, a server serving a truncated copy): retried."""


class DeadlineError(TimeoutError):
    """A request that did not end within the storage's request deadline: retried, like other
    timeouts."""


class BadResponseError(OSError):
    """An answer that cannot be the bytes asked for (a 206 for another range, a status that is
    neither 200 nor 206): not retried."""


class RedirectRefusedError(OSError):
    """A redirect to another host, refused (storage option follow_redirects_to_other_hosts)."""


_TRANSIENT = ("Timeout", "Connection", "Disconnected", "Payload", "Reset", "Incomplete",
              "EndpointConnection", "ReadTimeout", "ClientOSError", "ShortRead")


def classify(exc: BaseException) -> tuple[bool, float | None]:
    """(retry?, Retry-After seconds) for an exception from fsspec, aiohttp or botocore.  Never
    retried: missing (404), forbidden (401/403), bad request (400).

    Args:
        exc: the exception a request raised.
    """
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False, None
    status = getattr(exc, "status", None)
    response = getattr(exc, "response", None)
    if status is None and isinstance(response, dict):  # botocore ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if isinstance(status, int):
        if status == 429 or status >= 500:
            return True, _retry_after(getattr(exc, "headers", None) or {})
        return False, None
    name = type(exc).__name__
    if isinstance(exc, (TimeoutError, ConnectionError, asyncio.TimeoutError, ShortReadError)) or \
            any(t in name for t in _TRANSIENT):
        return True, None
    return False, None


def _retry_after(headers) -> float | None:
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def in_chain(exc: BaseException | None, kind: type) -> BaseException | None:
    """The first exception of type ``kind`` among ``exc`` and its causes and contexts (fsspec
    may wrap one), or None.

    Args:
        exc: the exception raised.
        kind: the type looked for.
    """
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, kind):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a timeout of any library's (Python's, asyncio's, aiohttp's, fsspec's).

    Args:
        exc: the exception raised.
    """
    return isinstance(exc, (TimeoutError, asyncio.TimeoutError)) or \
        "Timeout" in type(exc).__name__
