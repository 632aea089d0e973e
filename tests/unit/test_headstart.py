"""HeadStart: the shared token that lets DataLoader workers wait for worker 0 (bounded)."""

import multiprocessing
import os
import pickle
import time

from shardpack.loader.headstart import HeadStart


def test_worker_waits_for_worker_0_and_never_longer_than_the_limit():
    head = HeadStart(limit=5.0)
    head.begin(epoch=3)
    ctx = multiprocessing.get_context("fork")

    def worker_0():
        head.begin(epoch=3)  # its own first iteration: the same token as the parent's first
        time.sleep(0.3)
        head.done()
        os._exit(0)

    proc = ctx.Process(target=worker_0)
    proc.start()
    waited = head.wait()
    proc.join()
    assert 0.2 <= waited < 4.0  # released by the other process, long before the limit
    alone = HeadStart(limit=0.2)
    alone.begin(epoch=0)
    assert 0.2 <= alone.wait() < 1.0  # nobody signals: bounded


def test_iterations_are_counted_per_process_and_copies_get_their_own_page():
    head = HeadStart(limit=1.0)
    assert [head.begin(0), head.begin(0)] == [1, 2]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=lambda: out.put(head.begin(0)))  # a forked worker counts anew
    proc.start()
    assert out.get(timeout=10) == 1
    proc.join()
    copy = pickle.loads(pickle.dumps(head))
    copy.token = 12345
    copy.done()
    assert head._page.value != 12345  # a copy never signals the original's workers
