"""Looking at a dataset: verify, statistics, preview sheets, the pipeline benchmark.
"""
