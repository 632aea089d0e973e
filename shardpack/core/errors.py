"""One exception hierarchy for shardpack.

Every error subclasses both :class:`ShardpackError` and the builtin that fits, so callers can catch
either (``except ValueError`` keeps working).  Errors carry the path (file, shard or dataset) and,
where one exists, the byte offset or sample key, and format as a single line that says what is
wrong and, where there is one, what to do.
"""

from __future__ import annotations

import json
import re

# marks an option named in an error's text (:func:`option_hint`): the Python API shows it as a
# keyword, the command line as its flag, so neither reader is told a spelling it cannot use
_MARK = "\x1f"
_MARKED = re.compile(_MARK + r"(\w+)=([^" + _MARK + r"]*)" + _MARK)


def option_hint(name: str, value=True) -> str:
    """An option named in an error's message or hint: shown as the Python keyword
    (``on_error="skip"``) by ``str(error)``, as the command's flag (``--skip-bad``) by the
    command line (:meth:`ShardpackError.render`).

    Args:
        name: the keyword (a field of an options dataclass, or a function's keyword).
        value: the value to pass (True: a yes/no option turned on).
    """
    return f"{_MARK}{name}={json.dumps(value)}{_MARK}"


# the options errors name most, ready to put in a message
SKIP_BAD = option_hint("on_error", "skip")
RESUME = option_hint("resume")
OVERWRITE = option_hint("overwrite")


def python_spelling(name: str, value) -> str:
    """``name=value`` as a Python call spells it: ``on_error="skip"``, ``resume=True``."""
    shown = json.dumps(value) if isinstance(value, str) else repr(value)
    return f"{name}={shown}"


def render_options(text: str, spell=python_spelling) -> str:
    """``text`` with each :func:`option_hint` marker spelled by ``spell(name, value)``.

    Args:
        text: a message or hint.
        spell: turns (keyword, value) into the reader's spelling.
    """
    if _MARK not in text:
        return text
    return _MARKED.sub(lambda m: spell(m.group(1), json.loads(m.group(2))), text)


class ShardpackError(Exception):
    """Base class of every shardpack error."""

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None,
                 key: str | None = None, hint: str | None = None):
        if "Original Traceback" in message:  # re-raised by a DataLoader: keep the real error
            marker = f"{type(self).__module__}.{type(self).__name__}: "
            message = "in a DataLoader worker: " + message.rsplit(marker, 1)[-1].strip()
        self.message = message
        self.path = path
        self.offset = offset
        self.key = key
        self.hint = hint
        super().__init__(self.__str__())

    def __reduce__(self):  # keep the fields when an error crosses a process boundary
        return (_rebuild, (type(self), self.message, self.path, self.offset, self.key, self.hint))

    def __str__(self) -> str:  # one line, always
        return self.render()

    def render(self, spell=python_spelling) -> str:
        """The one-line text, with the options it names spelled by ``spell(name, value)``
        (default: as Python keywords; the command line passes its flags).

        Args:
            spell: turns (keyword, value) into the reader's spelling of an option.
        """
        parts = []
        if self.path is not None:
            parts.append(str(self.path))
        if self.key is not None:
            parts.append(f"sample {self.key!r}")
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        where = ", ".join(parts) + ": " if parts else ""
        text = f"{where}{self.message}"
        if self.hint:
            text += f" ({self.hint})"
        return " ".join(render_options(text, spell).split("\n"))


def _rebuild(cls, message, path, offset, key, hint):
    return cls(message, path=path, offset=offset, key=key, hint=hint)


class FormatError(ShardpackError, ValueError):
    """Bytes on disk do not follow the format: bad magic, bad CRC, truncation, bad index."""


class VersionError(FormatError):
    """A format version or codec this release does not know."""


class IntegrityError(FormatError):
    """A content hash or checksum does not match what the manifest or index records."""


class SourceError(ShardpackError, ValueError):
    """An input file or listing cannot be packed as it is (special file, link outside, bad row)."""


class BrokenImageError(SourceError):
    """An image file that is empty, not the image its extension says, or truncated."""


class PackError(ShardpackError, RuntimeError):
    """Packing failed for a reason outside the input (disk full, resume mismatch, worker died)."""


class FileSystemError(PackError, OSError):
    """The file system refused a read or write of unpack or export (disk full, permissions, ...):
    one line; ``errno`` is the original one.  Both a PackError and an OSError, so ``except
    OSError`` keeps working."""

    def __init__(self, message: str, *, errno: int | None = None, **kwargs):
        super().__init__(message, **kwargs)
        self.errno = errno


class CacheError(ShardpackError, OSError):
    """The local shard cache cannot be written (disk full, permissions): a local problem, not
    retried and not blamed on the remote."""


class DatasetNotFoundError(ShardpackError, FileNotFoundError):
    """A dataset, shard or sample that should exist does not."""


class DecodeError(ShardpackError, ValueError):
    """An image field that cannot be decoded (corrupt, truncated, unsupported)."""


class DeviceError(ShardpackError, RuntimeError):
    """The device path cannot run here: no CUDA device, no or too old torchvision, nvJPEG
    missing (found once, when the DeviceLoader is made)."""


class RemoteError(ShardpackError, OSError):
    """A remote request failed for good (after retries, or at once for 403 and similar)."""


class UnsafePathError(ShardpackError, ValueError):
    """A name that would write outside the output folder (absolute, '..', link, device)."""


__all__ = [
    "BrokenImageError",
    "CacheError",
    "DatasetNotFoundError",
    "DecodeError",
    "DeviceError",
    "FileSystemError",
    "FormatError",
    "IntegrityError",
    "PackError",
    "RemoteError",
    "ShardpackError",
    "SourceError",
    "UnsafePathError",
    "VersionError",
    "OVERWRITE",
    "RESUME",
    "SKIP_BAD",
    "option_hint",
    "python_spelling",
    "render_options",
]
