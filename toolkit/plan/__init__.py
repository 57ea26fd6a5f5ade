"""Planning: search layouts and offers for the fastest or cheapest fitting run; the doctor. No torch.

Imports: specs, estimate, capability, runs."""

from .search import pareto_front, search

__all__ = ["search", "pareto_front"]
