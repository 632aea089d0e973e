"""Image content: which fields hold images, their formats and sizes from headers, cheap checks
and decoding to RGB pixels (used by the writer, the transforms and the inspectors).
"""
