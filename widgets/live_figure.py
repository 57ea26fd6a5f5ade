"""A plotly FigureWidget that a reloaded browser tab draws as it is now, quickly, with plotly.js sent once.

Two things plotly's FigureWidget does not do:

- It sends each change to the page as a message (restyle, relayout, update, added or deleted traces) and leaves
  the widget's synced state, `_widget_data` and `_widget_layout`, at the figure it was created with. A page that
  connects later (a reloaded tab, a second view) builds its view from that state, so every chart came back empty
  or stale after a reload. After each message this class copies the figure into that state. The page's code does
  not redraw on a change of it (plotly's `do_data`/`do_layout` do nothing), so a change is still drawn once.
- Its page code (`_esm`: plotly.js and the widget, 5 MB) is a synced trait of every figure, so each figure sends
  it on display and again in the state a reloaded tab asks the kernel for. With the planner's figures that reply was
  20 MB; ipywidgets gives it 4 s ("Control comm did not respond in time"), and on a loaded machine a reloaded tab
  showed "Error displaying widget: model not found". Here `_esm` is a 1 KB loader; the page asks the kernel for
  the bundle once (an anywidget command, as one binary buffer) and every figure on the page shares it.
"""

from copy import deepcopy
from functools import cache

import plotly.graph_objects as go
from anywidget.experimental import command

__all__ = ["LiveFigure"]

_LOADER = """
const SHARED = "__llm_toolkit_plotly_widget";   // one bundle per page, whichever figure asks first

function plotlyBundle(experimental) {
  if (!globalThis[SHARED]) {
    globalThis[SHARED] = experimental.invoke("_plotly_bundle", null, { signal: AbortSignal.timeout(300000) })
      .then(([, buffers]) => import(URL.createObjectURL(new Blob([buffers[0]], { type: "text/javascript" }))))
      .catch((error) => { delete globalThis[SHARED]; throw error; });
  }
  return globalThis[SHARED];
}

// The bundle is asked for at the first view, not in initialize: a reply that arrives while anywidget is still
// initializing the model never reaches it.
export default () => {
  let context, figure;                         // plotly's own widget for this model, made at its first view
  return {
    initialize(modelContext) {
      context = modelContext;
    },
    async render(view) {
      figure ??= plotlyBundle(context.experimental).then(async (bundle) => {
        const made = await bundle.default();
        await made.initialize(context);
        return made;
      });
      return (await figure).render(view);
    },
  };
};
"""


@cache
def _bundle_bytes() -> bytes:
    return str(go.FigureWidget._esm).encode()  # (anywidget read plotly's bundle file when plotly loaded)


class LiveFigure(go.FigureWidget):
    _esm = _LOADER

    @command
    def _plotly_bundle(self, _msg, _buffers):
        """plotly's page code, asked for once by the page (see the module's docstring)."""
        return None, [_bundle_bytes()]

    def _keep_state(self) -> None:
        with self.hold_sync():  # (both in one message)
            self._widget_data = deepcopy(self._data)
            self._widget_layout = deepcopy(self._layout_obj._props)


_MESSAGES = (
    "_send_relayout_msg",
    "_send_restyle_msg",
    "_send_addTraces_msg",
    "_send_moveTraces_msg",
    "_send_update_msg",
    "_send_animate_msg",
    "_send_deleteTraces_msg",
)
"""plotly.basewidget's senders: every change to the page goes through one of them."""


def _then_keep_state(name: str):
    def send(self, *args, **kwargs):
        getattr(go.FigureWidget, name)(self, *args, **kwargs)
        self._keep_state()

    send.__name__ = name
    return send


for _name in _MESSAGES:
    setattr(LiveFigure, _name, _then_keep_state(_name))
