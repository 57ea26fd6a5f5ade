"""Serve: serving for real: `toolkit generate` runs a serving job's requests with a KV cache on one process or
tensor-parallel ranks and records what it measured; compare sets it beside the estimate.

Imports: specs, estimate, capability, runs, program, launch, checkpoint."""
