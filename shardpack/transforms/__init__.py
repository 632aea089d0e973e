"""Bytes -> pixels: the transform spec, CPU and GPU decode with their crops, and DeviceLoader,
which moves batches to the device and decodes there.
"""
