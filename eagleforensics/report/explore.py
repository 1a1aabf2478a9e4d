"""Interactive explorer of one alignment: pick a slot, a position and a token range; the plots redraw in place.

``Explorer(result)`` holds ipywidgets controls and one ``Output`` area per figure; every
change rebuilds the figures from ``plots`` and redraws each area (``clear_output(wait=True)``
keeps the page from jumping). ``figures`` always holds the latest figures, so the update
logic is testable without a browser or a kernel.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..positions import Position
from . import plots

if TYPE_CHECKING:  # pragma: no cover
    import plotly.graph_objects as go

    from ..results import AlignmentResult

MAX_NEIGHBOURS = 4


class Explorer:
    """Widgets over one ``AlignmentResult``: slot, position, token range, neighbours -> heatmap, profile, per-token."""

    def __init__(self, result: AlignmentResult, draw: bool = True) -> None:
        import ipywidgets as w

        self.result = result
        self.draw = draw
        length = max(result.tokens.length, 1)
        self.slot = w.Dropdown(options=[(m.name, i) for i, m in enumerate(result.matches)], value=0,
                               description="slot")
        self.position = w.Dropdown(options=[(plots.column_label(result, result.columns[j]), j)
                                            for j in plots.drawn_columns(result)],
                                   value=self._best_column(0), description="position")
        self.tokens = w.IntRangeSlider(value=(0, length - 1), min=0, max=length - 1, step=1,
                                       description="tokens", continuous_update=False)
        self.neighbours = w.IntSlider(value=1, min=0, max=MAX_NEIGHBOURS, description="neighbours")
        self.outputs = {name: w.Output() for name in ("heatmap", "profile", "per_token")}
        self.figures: dict[str, go.Figure] = {}
        self.slot.observe(self._slot_changed, names="value")
        for control in (self.position, self.tokens, self.neighbours):
            control.observe(self.refresh, names="value")
        self.refresh()

    def _best_column(self, slot: int) -> int:
        best = self.result.matches[slot].best
        return self.result.columns.index(best) if best in self.result.columns else 0

    def _slot_changed(self, _change: Any = None) -> None:
        """A new slot starts at its own best position (which also redraws)."""
        target = self._best_column(self.slot.value)
        if self.position.value == target:
            self.refresh()
        else:
            self.position.value = target

    @property
    def selected_position(self) -> Position:
        return self.result.columns[self.position.value]

    def build(self) -> dict[str, go.Figure]:
        """The three figures for the current selection."""
        i, pos = self.slot.value, self.selected_position
        a, b = self.tokens.value
        return {
            "heatmap": plots.score_heatmap(self.result, highlight=(i, pos)),
            "profile": plots.norm_profile(self.result, highlight=i),
            "per_token": plots.per_token_cosine(self.result, i, self.neighbours.value, position=pos,
                                                tokens=(a, b + 1)),
        }

    def refresh(self, _change: Any = None) -> None:
        """Rebuild the figures and redraw each output area in place."""
        from .nbview import show

        self.figures = self.build()
        if not self.draw:
            return
        for name, out in self.outputs.items():
            with out:
                out.clear_output(wait=True)
                show(self.figures[name])

    def widget(self) -> Any:
        """The controls above the three output areas."""
        import ipywidgets as w

        controls = w.HBox([w.VBox([self.slot, self.position]), w.VBox([self.tokens, self.neighbours])])
        return w.VBox([controls, self.outputs["heatmap"], self.outputs["profile"], self.outputs["per_token"]])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())
