"""Where pack's tasks run: an engine, chosen once per pack (``--engine local|dask|ray``).

An engine turns a function call into a ``concurrent.futures.Future`` and says how many tasks can
run at once (:attr:`Engine.workers`); the packer keeps twice that many in flight, so a cluster of
64 workers gets 128 tasks at a time while the driver holds only those.  Tasks are plain
functions of picklable arguments (:class:`~shardpack.write.plan.ShardTask`, URLs, option dicts): no
engine state crosses into them, and a task that runs twice writes the same bytes (every shard is
written to a temp name and renamed), so an engine may rerun a task whose worker died.

* ``local``: a process pool of ``workers`` processes on this machine (fork), or inline when
  ``workers == 1``.
* ``dask``: a ``distributed.Client`` on ``address`` (``tcp://host:8786``), or a LocalCluster of
  ``workers`` single-threaded processes started for this pack and stopped after it.  Dask
  reruns a task whose worker died (``distributed.scheduler.allowed-failures``, 3 by default).
* ``ray``: ``ray.init(address)`` (``auto``, ``ray://host:10001``), or a local Ray started for this
  pack and shut down after it.  Tasks are ``ray.remote(max_retries=3)``: rerun if their worker
  dies.
* any ``concurrent.futures.Executor`` passed as ``executor=`` (Python only).

docs/scale.md says how to run each at cluster scale.
"""

from __future__ import annotations

import os
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from multiprocessing import get_context

from shardpack.core.errors import PackError, ShardpackError

ENGINES = ("local", "dask", "ray")


class Engine:
    """Runs tasks; ``with`` closes what it started (never a cluster it only connected to).

    NOTE [tasks after a failure]: a pack that fails must not leave tasks writing into OUT once
    it has released OUT's lock (a rerun with --overwrite would race them).  Every task
    submitted is remembered until it is done, and :meth:`stop` cancels those not started and
    waits for the rest, before the packer cleans up and lets go of OUT."""

    name = "engine"
    workers = 1          # tasks that can run at once
    inline = False       # run tasks in this process, one after another
    shared_counter = None  # a counter in shared memory the workers add files to (local pool)

    def submit(self, fn, *args):
        """A future-like (``result(timeout)``, ``cancel()``) for ``fn(*args)`` run by the
        engine."""
        outstanding = self.__dict__.setdefault("_outstanding", [])
        if len(outstanding) > 4 * self.workers:
            outstanding[:] = [f for f in outstanding if not _settled(f)]
        future = self._submit(fn, *args)
        outstanding.append(future)
        return future

    def _submit(self, fn, *args):
        raise NotImplementedError

    def stop(self) -> None:
        """Cancel the tasks not started, wait for the running ones (their errors are not the
        news: the failure that stopped the pack is)."""
        outstanding = self.__dict__.get("_outstanding", [])
        for future in outstanding:
            future.cancel()
        for future in outstanding:
            try:
                future.result()
            except BaseException:  # noqa: BLE001 - cancelled, or failed like the first
                pass
        outstanding.clear()

    def map_ordered(self, fn, items, limit: int | None = None):
        """``fn(item)`` for every item, results yielded in item order, at most ``limit`` (twice
        the workers by default) running or waiting to be collected."""
        if self.inline:
            for item in items:
                yield fn(item)
            return
        limit = limit or 2 * self.workers
        pending: list[Future] = []
        for item in items:
            pending.append(self.submit(fn, item))
            while len(pending) >= limit:
                yield pending.pop(0).result()
        while pending:
            yield pending.pop(0).result()

    def close(self) -> None:
        """Stop what the engine started (a pool, a local cluster); nothing for the others."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class InlineEngine(Engine):
    """Runs each task in this process, one after another (``--workers 1``)."""

    name, inline = "local", True


class LocalEngine(Engine):
    """A fork-context process pool on this machine; workers report files written through a
    shared counter (the progress bar) and die with the packer (PR_SET_PDEATHSIG)."""

    name = "local"

    def __init__(self, workers: int, initializer=None):
        self.workers = workers
        self.shared_counter = get_context("fork").Value("q", 0)
        self.pool = ProcessPoolExecutor(workers, mp_context=get_context("fork"),
                                        initializer=initializer,
                                        initargs=(self.shared_counter,))

    def _submit(self, fn, *args) -> Future:
        return self.pool.submit(fn, *args)

    def close(self) -> None:
        """Shut the pool down: tasks not started are cancelled, running ones waited for."""
        self.pool.shutdown(wait=True, cancel_futures=True)


class ExecutorEngine(Engine):
    """A caller's ``concurrent.futures.Executor`` (kept open: the caller owns it)."""

    name = "executor"

    def __init__(self, executor: Executor, workers: int | None = None):
        self.executor = executor
        self.workers = workers or getattr(executor, "_max_workers", None) or os.cpu_count() or 1

    def _submit(self, fn, *args) -> Future:
        return self.executor.submit(fn, *args)


class DaskEngine(Engine):
    """Tasks on a Dask cluster: the scheduler at ``address``, or a LocalCluster of ``workers``
    single-threaded processes started for this pack."""

    name = "dask"

    def __init__(self, address: str | None = None, workers: int | None = None):
        distributed = _need("distributed", "dask")
        self.cluster = self.client = None
        try:
            if address:
                self.client = distributed.Client(address, set_as_default=False, timeout=30)
            else:
                self.cluster = distributed.LocalCluster(
                    n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                    processes=True, dashboard_address=None, host="127.0.0.1")
                self.client = distributed.Client(self.cluster, set_as_default=False)
            self.client.wait_for_workers(1, timeout=120)
            info = self.client.scheduler_info(n_workers=-1)["workers"]
        except BaseException:
            self.close()  # a half-started cluster is not left running
            raise
        self.workers = max(1, sum(w.get("nthreads", 1) for w in info.values()))

    def _submit(self, fn, *args) -> Future:
        # pure=False: two tasks with equal arguments are still two tasks (and no result is
        # reused from an earlier pack that ran on a long-lived cluster)
        return _to_future(self.client.submit(fn, *args, pure=False))

    def close(self) -> None:
        """Close the client, and the local cluster if this engine started one."""
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()


class RayEngine(Engine):
    """Tasks on Ray: the cluster at ``address``, or a local Ray started for this pack with
    ``workers`` CPUs; an already initialised Ray is used as it is."""

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None):
        ray = _need("ray", "ray")
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            kwargs = dict(address=address, include_dashboard=False, log_to_driver=False,
                          configure_logging=False)
            if not address:  # a local Ray for this pack: its CPUs are the workers
                kwargs.update(num_cpus=workers or os.cpu_count() or 1)
            ray.init(**kwargs)
        try:
            self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        except BaseException:
            self.close()
            raise
        # one remote function for every task (ray.remote takes functions, not partials)
        self._task = ray.remote(max_retries=3, num_cpus=1)(_call)

    def _submit(self, fn, *args) -> "_RayFuture":
        # not ObjectRef.future(): its callbacks are slow (docs/benchmarks.md, "Engines and the
        # walk")
        return _RayFuture(self.ray, self._task.remote(fn, *args))

    def close(self) -> None:
        """Shut Ray down if this engine started it."""
        if self.started:
            self.ray.shutdown()


def check_engine(engine: str, address: str | None) -> None:
    """Refuse a bad engine choice before anything is started or written."""
    if engine not in ENGINES:
        raise ShardpackError(f"unknown engine {engine!r}: expected one of {ENGINES}")
    if address and engine == "local":
        raise ShardpackError("--address is for the dask and ray engines",
                             hint="pass --engine dask or --engine ray")


def make_engine(engine: str = "local", *, address: str | None = None,
                workers: int | None = None, executor: Executor | None = None,
                initializer=None) -> Engine:
    """The engine for ``pack``/``convert``: ``executor`` wins; else ``engine`` by name."""
    if executor is not None:
        return ExecutorEngine(executor)
    check_engine(engine, address)
    if engine in ("dask", "ray"):
        try:
            return (DaskEngine if engine == "dask" else RayEngine)(address, workers)
        except ShardpackError:
            raise
        except Exception as exc:  # no scheduler there, a cluster that would not start, ...
            where = f" at {address}" if address else ""
            raise PackError(f"cannot start or reach the {engine} engine{where}: "
                            f"{type(exc).__name__}: {exc}".splitlines()[0],
                            hint="check --address and that the cluster is up") from None
    count = workers or os.cpu_count() or 1
    return LocalEngine(count, initializer) if count > 1 else InlineEngine()


def _need(module: str, extra: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ShardpackError(f"the {extra} engine needs {module}, which is not installed",
                             hint=f"pip install 'shardpack[{extra}]'") from None


def _settled(future) -> bool:
    done = getattr(future, "done", None)
    return bool(done()) if done is not None else False


def _call(fn, *args):
    return fn(*args)


class _RayFuture:
    """The part of a Future the packer uses (``result(timeout)``), over ``ray.get``; a task's
    error comes back as itself (the ShardpackError with its one line), not wrapped."""

    def __init__(self, ray, ref):
        self.ray, self.ref = ray, ref

    def cancel(self) -> bool:
        """Not cancelled: Engine.stop() waits for it to finish (at most twice the workers' tasks
        are in flight).  ``ray.cancel`` of a queued task that completes at that moment aborted
        the whole driver process in Ray 2.60 (a failed CHECK in its task manager, seen in CI
        after a pack that stopped on a broken image); a user's training script must not die
        of a failed pack."""
        return False

    def done(self) -> bool:
        return bool(self.ray.wait([self.ref], timeout=0)[0])

    def result(self, timeout: float | None = None):
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(self.ref, timeout=timeout)
        except exceptions.GetTimeoutError:
            raise TimeoutError from None
        except exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise


def _to_future(dask_future) -> Future:
    """A ``concurrent.futures.Future`` completed by a dask future's callback."""
    out: Future = Future()

    def done(f) -> None:
        try:
            out.set_result(f.result())
        except BaseException as exc:  # the task's error, or CancelledError
            out.set_exception(exc)

    dask_future.add_done_callback(done)
    out.dask_future = dask_future  # keeps it referenced: a dropped future is cancelled
    # Engine.stop() waits for it: cancelling this Future would not stop the dask task, which
    # might still write a shard after the pack gave up OUT
    out.cancel = lambda: False
    return out
