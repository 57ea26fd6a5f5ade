"""The program one rank runs: the model, its parallel layout (FSDP2, DDP, the DTensor tensor and sequence plan,
pipeline stages, DeepSpeed's engine), precision, the optimizer, the step, LoRA/QLoRA, and the memory instrument.
The runner (toolkit.train) and the tracer (toolkit.trace) both build it here; neither imports the other.

Imports: specs, estimate, export."""
