"""Shards + index -> sample bytes: the dataset reader, how it gets at a shard (access modes),
fetching ahead, and several datasets read as one (mixtures).
"""
