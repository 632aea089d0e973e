"""Readers of other tools' dataset formats, for ``shardpack convert``.

Each module holds one format's reader: a :class:`~shardpack.interop.sources.base.ContainerSource`
subclass that turns the source's files into :class:`~shardpack.write.samples.SourceSample` (byte
ranges
of the source files where the bytes are stored as they are, inline values where they had to be
decoded).  The packer's planner and shard writer do the rest, exactly as for ``shardpack pack``.
"""
