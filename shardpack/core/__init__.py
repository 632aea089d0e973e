"""The small core every layer shares: the exception hierarchy, sizes and counts, the version.

Nothing here imports another shardpack package.
"""
