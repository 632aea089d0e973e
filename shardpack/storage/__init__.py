"""The one storage layer: every read and write of a dataset goes through a :class:`Storage`.

``Storage(url, storage_options)`` builds the class of the URL's kind, chosen once
(:func:`~shardpack.storage.base.storage_class`):

* base.py: the :class:`Storage` ABC (what every kind does) and the choice of kind;
* local.py: :class:`LocalStorage`, files of this machine;
* remote.py: :class:`RemoteStorage`, any other fsspec URL (retried, bounded requests);
* http.py: :class:`HttpStorage`, HTTP(S) read by a bounded request path of its own;
* retry.py: the retry policy and the request errors; options.py: shardpack's own storage
  options; regular.py: local reads of regular files only; cache.py: the shared shard cache.
"""

from shardpack.storage.base import (
    BODY_CAP, MANIFEST_CAP, TEMP_MARK, Storage, is_temp_name, storage_class, within,
)
from shardpack.storage.http import HttpStorage
from shardpack.storage.local import LocalStorage
from shardpack.storage.options import (
    OWN_OPTIONS, REQUEST_DEADLINE, StorageOptionError, storage_options_by_keyword,
)
from shardpack.storage.regular import check_regular, open_regular, read_fd, read_regular
from shardpack.storage.remote import RemoteStorage, manifest_sizes
from shardpack.storage.retry import (
    BadResponseError, DeadlineError, RedirectRefusedError, RetryPolicy, ShortReadError, classify,
)

__all__ = [
    "BODY_CAP", "MANIFEST_CAP", "OWN_OPTIONS", "REQUEST_DEADLINE", "TEMP_MARK",
    "BadResponseError", "DeadlineError", "HttpStorage", "LocalStorage", "RedirectRefusedError",
    "RemoteStorage", "RetryPolicy", "ShortReadError", "Storage", "StorageOptionError",
    "check_regular", "classify", "is_temp_name", "manifest_sizes", "open_regular", "read_fd",
    "read_regular", "storage_class", "storage_options_by_keyword", "within",
]
