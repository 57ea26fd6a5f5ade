"""Time-to-train at a given MFU, and what it costs on a cloud offer (billed per whole instance)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..specs.catalog import Offer

__all__ = ["train_seconds", "OfferCost", "offer_cost"]


def train_seconds(total_flops: float, devices: int, peak_flops: float, mfu: float) -> float:
    """Wall-clock seconds when every device sustains `mfu` of its dense peak."""
    return total_flops / (devices * peak_flops * mfu)


@dataclass(frozen=True)
class OfferCost:
    instances: int
    """Whole instances rented (devices rounded up to the offer's instance size)."""
    idle_devices: int
    """Devices paid for but unused in the last instance."""
    price_per_hour: float | None
    amount: float | None
    currency: str
    spot: bool
    amount_spot_low: float | None = None
    """With --spot: the cost at the low end of the spot price range."""


def offer_cost(offer: Offer, devices: int, train_s: float | None, spot: bool) -> OfferCost:
    instances = math.ceil(devices / offer.count)
    price = offer.spot_per_hour_high if spot else offer.on_demand_per_hour
    hours = None if train_s is None else train_s / 3600.0
    amount = None if price is None or hours is None else instances * price * hours
    low = None
    if spot and offer.spot_per_hour_low is not None and hours is not None:
        low = instances * offer.spot_per_hour_low * hours
    return OfferCost(
        instances=instances,
        idle_devices=instances * offer.count - devices,
        price_per_hour=price,
        amount=amount,
        currency=offer.currency,
        spot=spot,
        amount_spot_low=low,
    )
