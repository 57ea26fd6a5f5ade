"""The small mark each figure in a panel carries: whether it is measured, calibrated, modelled or assumed (the
estimate's `provenance` keys), so a number on screen says what it stands on."""

from __future__ import annotations

import html

__all__ = ["provenance_mark", "MEANINGS"]

MEANINGS = {
    "measured": "measured on a run",
    "calibrated": "scaled to a step measured on your stack",
    "modelled": "modelled from kernel and collective measurements",
    "assumed": "modelled from stated assumptions: no measurement of this part",
    "given": "from the MFU you gave",
}
"""What each mark means (its hover text)."""


def provenance_mark(provenance: str | None) -> str:
    """A small grey tag, e.g. "modelled", with its meaning on hover; nothing where the figure has no label."""
    if not provenance:
        return ""
    title = html.escape(MEANINGS.get(provenance, provenance), quote=True)
    return f' <small style="color:#777" title="{title}">[{html.escape(provenance)}]</small>'
