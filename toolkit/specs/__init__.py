"""Specs: the Job and its parts, the catalogs, and the checks that keep them consistent.

Imports no torch: the planner and widgets build thousands of Jobs a second from here.

Imports: nothing of ours."""

from .catalog import Accelerator, Catalog, Offer, Preset, load_catalog
from .errors import SpecError
from .hf_config import model_from_hf_config
from .job import (
    PRECISIONS,
    TORCH_SEMANTICS,
    Batch,
    Cluster,
    Cost,
    Job,
    MemoryOptions,
    Optimizer,
    Parallel,
    Precision,
    compute_dtype,
)
from .model import ModelSpec

__all__ = [
    "Accelerator",
    "Batch",
    "Catalog",
    "Cluster",
    "Cost",
    "Job",
    "MemoryOptions",
    "ModelSpec",
    "Offer",
    "Optimizer",
    "PRECISIONS",
    "Parallel",
    "Precision",
    "Preset",
    "SpecError",
    "TORCH_SEMANTICS",
    "compute_dtype",
    "load_catalog",
    "model_from_hf_config",
]
