"""The torch layer: datasets over a reader, batches as one byte buffer, buffers shared with
DataLoader workers, the batched gather path. Torch is imported in one module here (torchenv).
"""
