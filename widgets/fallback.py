"""What a panel's output says where JupyterLab cannot draw it: the plain text beside the widget in the output.

JupyterLab draws widgets only in a trusted notebook (every output made in this browser, or "Trust Notebook"
from the command palette) whose kernel still runs; elsewhere (GitHub, a reloaded tab of a notebook run only
in part, a stopped kernel) the text shows. ipywidgets' default text is the widget's repr, a screenful of
`PlannerPanel(children=(GridBox(…` that explains nothing.
"""

__all__ = ["PanelText"]


class PanelText:
    """Mixin for ipywidgets panels: a one-line stand-in instead of the raw repr (ipywidgets cuts it at 110
    characters)."""

    panel_name = "panel"

    def __repr__(self) -> str:
        return f"({self.panel_name}: run this cell to draw it, or trust the notebook: palette → Trust Notebook)"
