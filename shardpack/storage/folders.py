"""What a storage says about its folders: the primitives of a walk of a folder tree (``pack``'s
source walk, ``convert``'s look at a source), one implementation per storage kind."""

from __future__ import annotations

import abc


class Folders(abc.ABC):
    """The folder primitives every :class:`~shardpack.storage.base.Storage` kind implements.
    Paths are named as the storage's ``location()`` names them: a walk builds them by joining
    names onto it."""

    @abc.abstractmethod
    def kind(self, name: str = "", *, request: bool = True) -> str | None:
        """What ``name`` is: 'file', 'dir', 'other', None when nothing is there, or 'unknown'
        when telling would take a request and ``request`` is False.

        Args:
            name: a path relative to the root ("" for the root).
            request: whether a request may be made to tell.
        """

    @abc.abstractmethod
    def entries(self, folder: str) -> list[tuple[str, str, bool, bool]]:
        """(name, path, is a folder, is a link) of each entry of ``folder``, sorted by name.
        Raises OSError when it cannot be listed.

        Args:
            folder: a folder as :meth:`location` names it, or one below it.
        """

    @abc.abstractmethod
    def scan(self, folder: str, stop: tuple[str, ...] = ()) -> list[tuple] | None:
        """Every entry of ``folder``, sorted by name, as (name, path, kind, size, mtime_ns,
        real, problem): ``kind`` 'file', 'dir', the kind of a special file ('FIFO', 'socket',
        'device', 'special file') or None when ``problem`` says why it cannot be told; ``size``
        of a file (None otherwise); ``real`` the real path of a link (None otherwise);
        ``problem`` (reason, message) or None.  None when ``folder`` holds one of ``stop``.
        Raises OSError when it cannot be listed.

        Args:
            folder: a folder as :meth:`location` names it, or one below it.
            stop: names that make the scan stop at once.
        """

    @abc.abstractmethod
    def real(self, path: str) -> str:
        """The path that tells ``path`` from every other place here: its real path (links
        resolved) locally, its path on the store otherwise.

        Args:
            path: a path as :meth:`location` names it, or one below it.
        """

    @abc.abstractmethod
    def marked(self, folder: str, names: tuple[str, ...]) -> bool:
        """Whether ``folder`` holds one of ``names``.

        Args:
            folder: a folder as :meth:`location` names it, or one below it.
            names: file names, the one that matters most first.
        """

    def describe(self, name: str) -> tuple[str | None, str | None, tuple[str, str] | None]:
        """(kind, real, problem) of the one entry ``name``, as :meth:`scan` tells them, links
        followed: ``real`` its real path when a link is on the way (a converter's source file
        is judged by the walk's rule, shardpack/write/walk.py ``refusal``).  Here a file with
        no link and no problem: a store has neither links nor special files, and a missing
        object is told by its read.

        Args:
            name: a path relative to the root.
        """
        return "file", None, None

    @abc.abstractmethod
    def every_folder(self, names: list[str]) -> bool:
        """Whether every one of ``names`` (entries of the root) is a folder.

        Args:
            names: names of entries of the root.
        """

    @abc.abstractmethod
    def has_file_below(self, suffix: str, depth: int, peek: int) -> bool:
        """Whether a file whose name ends in ``suffix`` lies in a folder below the root that is
        not hidden, at most ``depth`` levels down.

        Args:
            suffix: the end of the name, e.g. ".parquet".
            depth: folder levels looked into.
            peek: entries of each folder looked at, where listing a folder whole costs time.
        """


def info_mtime_ns(info: dict) -> int:
    """An object's modification time in ns from fsspec info (s3 ``LastModified``, local
    ``mtime``, gcs ``updated``), else 0 (not checked).

    Args:
        info: what fsspec's ``ls(detail=True)`` or ``info`` gives for the object.
    """
    value = info.get("LastModified") or info.get("mtime") or info.get("updated")
    if value is None:
        return 0
    if isinstance(value, (int, float)):
        return int(value * 1e9)
    if isinstance(value, str):
        from datetime import datetime

        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return 0
    try:
        return int(value.timestamp() * 1e9)
    except (AttributeError, OverflowError, ValueError):
        return 0
