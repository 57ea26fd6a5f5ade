"""Serving for real: `toolkit generate` runs a serving job with a KV cache and records what it measured."""
