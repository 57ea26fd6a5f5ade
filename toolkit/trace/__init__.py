"""Measure the real PyTorch program on fake tensors: memory (MemTracker), later FLOPs."""
