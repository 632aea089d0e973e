"""Old spellings of public arguments, kept working with a DeprecationWarning.

A public function whose argument was renamed takes the old keyword too, for one minor release:
``@renamed(format="shard_format")`` makes ``f(format="tar")`` call ``f(shard_format="tar")`` and
warn once per call site.  Passing both spellings is a TypeError, as Python does for a repeated
keyword.  An old keyword whose values differ too maps through a function:
``@renamed(skip_bad=("on_error", lambda v: "skip" if v else "raise"))``.  A parameter made
keyword-only is still taken positionally: ``@keyword_only("storage_options")``.
"""

from __future__ import annotations

import functools
import inspect
import warnings


def renamed(**old_to_new: str | tuple):
    """Decorator: accept each old keyword (``old=new``) as a deprecated alias of the new one.

    Args:
        **old_to_new: old keyword name -> new keyword name, or -> (new keyword name, a function
            turning an old value into a new one).
    """
    def wrap(func):
        @functools.wraps(func)
        def call(*args, **kwargs):
            for old, new in old_to_new.items():
                new, convert = new if isinstance(new, tuple) else (new, None)
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{func.__qualname__}() got both {old}= and {new}=: "
                                        f"{old}= is the old name of {new}=, pass only {new}=")
                    warnings.warn(f"{func.__qualname__}(): {old}= is deprecated, use {new}=",
                                  DeprecationWarning, stacklevel=2)
                    value = kwargs.pop(old)
                    kwargs[new] = value if convert is None else convert(value)
            return func(*args, **kwargs)
        call.renamed = {old: new[0] if isinstance(new, tuple) else new
                        for old, new in old_to_new.items()}  # for the docs and the tests
        return call
    return wrap


def keyword_only(*names: str):
    """Decorator: the keyword-only parameters ``names`` are still taken positionally (in that
    order, after the function's positional parameters), as they were, with a DeprecationWarning.

    Args:
        *names: the parameters that were positional, in their old order.
    """
    def wrap(func):
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        positional = sum(p.kind in kinds for p in inspect.signature(func).parameters.values())

        @functools.wraps(func)
        def call(*args, **kwargs):
            if len(args) > positional:
                extra = args[positional:]
                if len(extra) > len(names):
                    raise TypeError(f"{func.__qualname__}() takes {positional + len(names)} "
                                    f"positional arguments but {len(args)} were given")
                for name, value in zip(names[:len(extra)], extra, strict=True):
                    if name in kwargs:
                        raise TypeError(f"{func.__qualname__}() got multiple values for "
                                        f"argument {name!r}")
                    kwargs[name] = value
                warnings.warn(f"{func.__qualname__}(): pass {', '.join(names[:len(extra)])} "
                              "by keyword", DeprecationWarning, stacklevel=2)
                args = args[:positional]
            return func(*args, **kwargs)
        return call
    return wrap
