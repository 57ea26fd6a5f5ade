"""The real runner: model, data, training loop (torch)."""
