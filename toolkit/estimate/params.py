"""Exact parameter counts of a ModelSpec: toolkit.specs.params, where they live (a fact of the model, which resolve
needs too), under the estimator's name."""

from ..specs.params import ParamCount, count_params, linear_params_per_layer, projection_shapes

__all__ = ["ParamCount", "count_params", "linear_params_per_layer", "projection_shapes"]
