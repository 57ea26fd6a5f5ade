"""Runs: the run folder's contract (job, metrics, memory per rank, catalogs: written by the runner, read by the
CLI, compare and the panels) and what Run starts on this machine (the job or a proxy). No torch.

Imports: specs, estimate, capability."""
