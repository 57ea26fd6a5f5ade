"""A plotly FigureWidget that a reloaded browser tab draws as it is now, not as it was first shown.

plotly sends each change to the page as a message (restyle, relayout, update, added or deleted traces) and
leaves the widget's synced state, `_widget_data` and `_widget_layout`, at the figure it was created with. A
page that connects later (a reloaded tab, a second view) builds its view from that state, so every chart
came back empty or stale after a reload. After each message this class copies the figure into that state.
The page's code does not redraw on a change of it (plotly's `do_data`/`do_layout` do nothing), so a change
is still drawn once.
"""
from copy import deepcopy

import plotly.graph_objects as go

__all__ = ["LiveFigure"]


class LiveFigure(go.FigureWidget):
    def _keep_state(self) -> None:
        with self.hold_sync():                  # (both in one message)
            self._widget_data = deepcopy(self._data)
            self._widget_layout = deepcopy(self._layout_obj._props)


_MESSAGES = ("_send_relayout_msg", "_send_restyle_msg", "_send_addTraces_msg", "_send_moveTraces_msg",
             "_send_update_msg", "_send_animate_msg", "_send_deleteTraces_msg")
"""plotly.basewidget's senders: every change to the page goes through one of them."""


def _then_keep_state(name: str):
    def send(self, *args, **kwargs):
        getattr(go.FigureWidget, name)(self, *args, **kwargs)
        self._keep_state()
    send.__name__ = name
    return send


for _name in _MESSAGES:
    setattr(LiveFigure, _name, _then_keep_state(_name))
