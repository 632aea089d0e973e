"""Files -> samples -> shards + index: the source walk, the plan, the shard writer, the packer
with its engines, the OUT folder's rules, the skip report, merge.
"""
