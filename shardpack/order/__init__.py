"""Which sample goes where, when: shuffle and partition over (rank, worker) as pure functions.

* :mod:`.spec`: :class:`~.spec.Order`, the order's settings as one frozen value with a state form;
* :mod:`.epoch`: one epoch's order (block + window shuffle, shard affinity);
* :mod:`.partition`: ranks, workers and resumes; one process's share (also the package's one
  namespace: everything above is importable from it);
* :mod:`.mixing`: mixtures' per-source counts and mixed epochs;
* :mod:`.state`: the checks a saved resume state passes before it is used.
"""
