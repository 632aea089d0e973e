"""Old spellings of public arguments, kept working with a DeprecationWarning.

A public function whose argument was renamed takes the old keyword too, for one minor release:
``@renamed(format="shard_format")`` makes ``f(format="tar")`` call ``f(shard_format="tar")`` and
warn once per call site.  Passing both spellings is a TypeError, as Python does for a repeated
keyword.
"""

from __future__ import annotations

import functools
import warnings


def renamed(**old_to_new: str):
    """Decorator: accept each old keyword (``old=new``) as a deprecated alias of the new one.

    Args:
        **old_to_new: old keyword name -> new keyword name.
    """
    def wrap(func):
        @functools.wraps(func)
        def call(*args, **kwargs):
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{func.__qualname__}() got both {old}= and {new}=: "
                                        f"{old}= is the old name of {new}=, pass only {new}=")
                    warnings.warn(f"{func.__qualname__}(): {old}= is deprecated, use {new}=",
                                  DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)
        call.renamed = dict(old_to_new)  # for the docs and the tests
        return call
    return wrap
