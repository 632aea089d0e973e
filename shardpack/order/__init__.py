"""Which sample goes where, when: shuffle and partition over (rank, worker) as pure functions.
"""
