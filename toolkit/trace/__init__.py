"""Trace: the real PyTorch program on fake tensors (one rank of any width: memory via MemTracker, FLOPs) or, for
pipelines and DeepSpeed, on small real gloo ranks; a trace set beside the estimate (report).

Imports: specs, estimate, capability, export, runs, program."""
