"""Storage options: the ones that are shardpack's own (checked here, removed before fsspec sees
the rest), and the old positional spelling of ``storage_options=``."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings

from shardpack.core.errors import ShardpackError
from shardpack.storage.retry import RetryPolicy

# Seconds one request may take from start to last byte (storage option request_deadline): a
# server that drips a byte now and then never trips the per-read timeout.  Room for a 256 MiB
# shard at 1 MB/s.
REQUEST_DEADLINE = 300.0
# storage_options that are shardpack's, not fsspec's (removed before fsspec sees them)
OWN_OPTIONS = ("request_deadline", "retry_attempts", "follow_redirects_to_other_hosts")


class StorageOptionError(ShardpackError, ValueError):
    """A storage option of shardpack's own with a value it cannot use."""


def flag_option(options: dict, name: str) -> bool:
    """A yes/no storage option: true or false (JSON, as ``-o NAME=true`` gives), never a
    string whose truth would be its being non-empty (``-o NAME=False`` is the string 'False',
    which ``bool`` reads as yes: a security switch turned on by its 'off').

    Args:
        options: the storage options.
        name: the option's name; missing is false.
    """
    value = options.get(name, False)
    if not isinstance(value, bool):
        raise StorageOptionError(f"storage option {name} must be true or false, not {value!r}")
    return value


def deadline_option(options: dict) -> float:
    """The request deadline in seconds (storage option ``request_deadline``, default
    :data:`REQUEST_DEADLINE`): a number over 0 and finite, or a :class:`StorageOptionError`.

    Args:
        options: the storage options.
    """
    value = options.get("request_deadline", REQUEST_DEADLINE)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value == float("inf"):
        raise StorageOptionError(f"storage option request_deadline must be a number of seconds "
                                 f"over 0, not {value!r}")
    return float(value)


def retry_option(options: dict, policy: RetryPolicy | None) -> RetryPolicy:
    """The retry policy of remote requests: ``policy`` (default :class:`RetryPolicy`), its
    attempts those of the storage option ``retry_attempts`` when given (a whole number of at
    least 1, or a :class:`StorageOptionError`): how a dataset or the CLI (``-o
    retry_attempts=10``) waits longer for a server that restarts.

    Args:
        options: the storage options.
        policy: the policy the storage was given, if any.
    """
    policy = policy or RetryPolicy()
    value = options.get("retry_attempts")
    if value is None:
        return policy
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise StorageOptionError(f"storage option retry_attempts must be a whole number of at "
                                 f"least 1, not {value!r}")
    return dataclasses.replace(policy, attempts=value)


def fsspec_options(options: dict) -> dict:
    """The storage options fsspec is given: all but shardpack's own (:data:`OWN_OPTIONS`).

    Args:
        options: the storage options.
    """
    return {k: v for k, v in options.items() if k not in OWN_OPTIONS}


def storage_options_by_keyword(func):
    """Decorator: ``storage_options`` is keyword-only in ``func``; passed by position, after
    ``func``'s positional arguments (the older spelling), it is still taken, with a
    DeprecationWarning.

    Args:
        func: a function or ``__init__`` with a keyword-only ``storage_options`` argument.
    """
    positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                     for p in inspect.signature(func).parameters.values())
    name = func.__qualname__.removesuffix(".__init__")

    @functools.wraps(func)
    def call(*args, **kwargs):
        if len(args) > positional:
            if len(args) > positional + 1 or "storage_options" in kwargs:
                raise TypeError(f"{name}() takes {positional - (name != func.__qualname__)} "
                                f"positional argument(s) and storage_options= by keyword")
            warnings.warn(f"{name}(): storage_options passed by position is deprecated, pass "
                          "storage_options=", DeprecationWarning, stacklevel=2)
            *args, kwargs["storage_options"] = args
        return func(*args, **kwargs)
    return call
