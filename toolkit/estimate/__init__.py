"""Analytic estimates (no torch): parameters, memory, FLOPs, time and cost of a Job.

Imports: specs."""

from .cost import OfferCost, offer_cost, train_seconds
from .flops import PF_DAY_FLOPS, TrainingFlops, training_flops
from .params import ParamCount, count_params
from .report import estimate, estimate_result
from .result import Estimate
from .states import StateBytes, bytes_per_param, model_state_bytes, params_per_device

__all__ = [
    "Estimate",
    "OfferCost",
    "PF_DAY_FLOPS",
    "ParamCount",
    "StateBytes",
    "TrainingFlops",
    "bytes_per_param",
    "count_params",
    "estimate",
    "estimate_result",
    "model_state_bytes",
    "offer_cost",
    "params_per_device",
    "train_seconds",
    "training_flops",
]
