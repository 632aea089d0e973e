"""Retries of remote requests: the policy, which failures are worth another attempt, the retry
loop every remote kind runs its requests in, and the errors the bounded request path raises
(shardpack/storage/http.py)."""

from __future__ import annotations

import asyncio
import contextvars
import random
import ssl
import time
from dataclasses import dataclass

from shardpack.core.errors import DatasetNotFoundError, RemoteError, ShardpackError


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
# Connection failures that another attempt will not mend: a certificate, a TLS handshake
_NEVER = ("SSL", "Certificate", "Fingerprint")


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
    # by every class it is one of: aiohttp's refused connection is a ClientConnectorError,
    # which names none of the words, but is a ClientOSError and a ClientConnectionError
    names = [k.__name__ for k in type(exc).__mro__]
    if isinstance(exc, ssl.SSLError) or any(t in n for n in names for t in _NEVER):
        return False, None
    if isinstance(exc, (TimeoutError, ConnectionError, asyncio.TimeoutError, ShortReadError)) or \
            any(t in n for n in names for t in _TRANSIENT):
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


# When the request running in this thread must end (time.monotonic()): the request deadline bounds
# a request's attempts and the waits between them together, not each attempt.
_ENDS: contextvars.ContextVar = contextvars.ContextVar("shardpack_request_ends", default=None)


def time_left(deadline: float) -> float:
    """Seconds left to the request running in this thread (its deadline runs from its first
    attempt), at least a millisecond; ``deadline`` when none is running.

    Args:
        deadline: the storage's request deadline.
    """
    ends = _ENDS.get()
    return deadline if ends is None else max(ends - time.monotonic(), 0.001)


def deadline_text(deadline: float, got: int | None = None) -> str:
    """The words for a request that ran out of its deadline.

    Args:
        deadline: the request deadline in seconds.
        got: bytes of the body that had come, if counted.
    """
    text = (f"no complete answer within the request deadline of {deadline:g} s "
            f"(storage option request_deadline)")
    return text + (f"; {got} byte(s) of the body had come" if got is not None else "")


def retried_call(storage, what: str, name: str, fn, args: tuple, kwargs: dict):
    """``fn(*args, **kwargs)``, one request of ``storage`` (a remote kind: HTTP(S), S3, any
    fsspec store), under its :class:`RetryPolicy`: a transient failure is tried again after the
    policy's backoff, as long as the request deadline, counted from the first attempt, is not
    passed; a ``timeout`` keyword (the sync timeout of an async fsspec call) is what is left of
    it.  A failure for good is a one-line :class:`RemoteError` naming the URL.

    Args:
        storage: the storage (its ``retry``, ``deadline``, ``stats`` and ``display``).
        what: the request, for the message ("read", "download").
        name: the file's path relative to the storage's root.
        fn: the request.
        args: its positional arguments.
        kwargs: its keyword arguments.
    """
    policy, started = storage.retry, time.monotonic()
    ends = started + storage.deadline
    token = _ENDS.set(ends)
    try:
        for attempt in range(policy.attempts):
            if attempt and "timeout" in kwargs:
                kwargs = {**kwargs, "timeout": time_left(storage.deadline)}
            storage.stats["requests"] += 1
            try:
                return fn(*args, **kwargs)
            except ShardpackError:  # decided already (a local failure, a changed file)
                raise
            except Exception as exc:  # noqa: BLE001 - classified below
                last, retry, after = _failure(storage, name, exc, ends)
            if not retry or attempt == policy.attempts - 1:
                break
            wait = policy.delay(attempt, after)
            if time.monotonic() + wait >= ends:  # never retried past the deadline
                break
            storage.stats["retries"] += 1
            time.sleep(wait)
    finally:
        _ENDS.reset(token)
    raise _gave_up(storage, what, name, last, attempt + 1, retry, time.monotonic() - started) \
        from last


def _failure(storage, name: str, exc: Exception, ends: float):
    """(the failure to report, retry?, Retry-After) for what one attempt raised."""
    if is_timeout(exc) and not isinstance(exc, DeadlineError) and time.monotonic() >= ends:
        exc = DeadlineError(deadline_text(storage.deadline))  # fsspec's sync(timeout=)
    refused = in_chain(exc, RedirectRefusedError)  # (fsspec may wrap it)
    if refused is not None:
        return refused, False, None
    if isinstance(exc, FileNotFoundError):
        # fsspec's HTTP size() says "missing" for a server it could not reach: the cause decides
        cause = exc.__cause__
        if cause is not None and not isinstance(cause, FileNotFoundError) and \
                classify(cause)[0]:
            return cause, True, None
        raise DatasetNotFoundError("file is missing", path=storage.display(name)) from None
    retry, after = classify(exc)
    return exc, retry, after


def _gave_up(storage, what: str, name: str, last: BaseException, attempts: int, retry: bool,
             took: float) -> RemoteError:
    # fsspec turns every timeout into an empty FSTimeoutError: the cause has the words
    cause = str(last) or str(last.__cause__ or "") or "no details"
    if not isinstance(last, DeadlineError) and is_timeout(last):
        cause += f" (per-request timeout {storage.retry.timeout:g} s)"
    hint = None
    if retry and not isinstance(last, ShortReadError):  # the budget is spent, not the file short
        hint = (f"gave up after {took:.1f} s and {attempts} attempts, all the retry policy "
                f"allows: check that the server is up and reachable, or allow more: storage "
                f"option retry_attempts"
                if attempts == storage.retry.attempts else
                f"gave up after {took:.1f} s at the request deadline, storage option "
                f"request_deadline: check that the server is up and reachable, or raise it")
    return RemoteError(f"{what} failed after {attempts} attempt(s): {type(last).__name__}: "
                       f"{cause}", path=storage.display(name), hint=hint)
