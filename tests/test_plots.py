"""Figures and tables of an alignment (``eagleforensics.report.plots``) and the explorer's update logic, without a notebook.

Data: ``data_samples/`` (real forward passes of a tiny Llama, N=12, H=128, 40 prompt tokens).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from eagleforensics.arrays import f32
from eagleforensics.report import plots
from eagleforensics.alignment import AlignmentResult, align
from eagleforensics.io.capture import load_capture
from eagleforensics.errors import ForensicsError
from eagleforensics.positions import Position
from eagleforensics.io.safeload import load_object
from eagleforensics.io.training import from_object, load_training

SAMPLES = Path(__file__).resolve().parent.parent / "data_samples"
HOSTILE = "<script>alert(1)</script>"


@pytest.fixture(scope="session")
def layout_result() -> AlignmentResult:
    return align(SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture.pt")


@pytest.fixture(scope="session")
def wrong_fix_result() -> AlignmentResult:
    return align(SAMPLES / "record_wrong_fix.pt", SAMPLES / "capture.pt")


def _record_from_samples(edit) -> object:
    """The layer-outputs record's slots (real data) rearranged by ``edit(hidden_states list, dict)``."""
    obj = torch.load(SAMPLES / "record_layer_outputs.pt", weights_only=True)
    hs = [t.clone() for t in obj["hidden_states"]]
    return edit(hs, {"input_ids": obj["input_ids"].clone()})


def _kept(result: AlignmentResult) -> list[int]:
    """Columns the heatmap draws: captured ones, and fitted ones where some slot was scored."""
    scored = np.isfinite(result.scores.score)
    return [j for j, c in enumerate(result.columns) if not plots.is_virtual(result, c) or scored[:, j].any()]


class TestScoreHeatmap:
    """The heatmap shows every slot x column score and marks each slot's chosen cell."""

    def test_grid_and_marks(self, layout_result: AlignmentResult) -> None:
        fig = plots.score_heatmap(layout_result)
        heat = fig.data[0]
        assert list(heat.y) == [m.name for m in layout_result.matches]
        kept = _kept(layout_result)
        assert list(heat.x) == [plots.column_label(layout_result, layout_result.columns[j]) for j in kept]
        z = np.array(heat.z, dtype=float)
        assert z.shape == (len(layout_result.matches), len(kept))
        chosen = next(d for d in fig.data if d.name == "chosen (confident)")
        assert list(chosen.x) == ["p3", "p7", "p10", "p12 post-norm"]
        assert list(chosen.y) == list(heat.y)
        for i, label in enumerate(chosen.x):  # the marked cell is the darkest of its row (closest to a perfect match)
            assert np.nanargmin(z[i]) == list(heat.x).index(label)

    def test_hover_carries_score_margin_rel_diff(self, layout_result: AlignmentResult) -> None:
        heat = plots.score_heatmap(layout_result).data[0]
        for word in ("score", "rel_diff", "margin"):
            assert word in heat.hovertemplate
        custom = np.array(heat.customdata, dtype=float)
        kept = _kept(layout_result)
        np.testing.assert_allclose(custom[..., 0], layout_result.scores.score[:, kept], equal_nan=True)
        np.testing.assert_allclose(custom[..., 1], layout_result.scores.rel_diff[:, kept], equal_nan=True)
        margins = [m.margin for m in layout_result.matches]
        np.testing.assert_allclose(custom[:, 0, 3], margins)

    def test_no_blank_columns_and_no_hover_on_unscored_cells(self, layout_result: AlignmentResult) -> None:
        """A fitted column is drawn only where some slot (one that may be the final state) was scored."""
        heat = plots.score_heatmap(layout_result).data[0]
        z = np.array(heat.z, dtype=float)
        assert np.isfinite(z).any(axis=0).all()  # no column blank from top to bottom
        dropped = [c for c in layout_result.columns if plots.column_label(layout_result, c) not in heat.x]
        assert dropped and all(plots.is_virtual(layout_result, c) for c in dropped)
        assert heat.hoverongaps is False and np.isnan(z).any()  # blank cells exist and have no hover
        fitted = [j for j, x in enumerate(heat.x) if x.endswith("(fitted)")]
        assert fitted and all("(fitted)" in heat.text[0][j] for j in fitted)
        assert all(heat.text[0][j] == "" for j in range(len(heat.x)) if j not in fitted)

    def test_legend_sits_above_the_plot(self, layout_result: AlignmentResult) -> None:
        """Below the plot a legend covers the tick labels ("p1 post-norm" read "1 post-norm")."""
        for fig in (plots.score_heatmap(layout_result), plots.norm_profile(layout_result),
                    plots.per_token_cosine(layout_result, 0)):
            legend = fig.layout.legend  # above the plot area, or right of it
            assert (legend.y >= 1 and legend.yanchor == "bottom") or (legend.x > 1 and legend.xanchor == "left")

    def test_fitted_columns_are_labelled(self, layout_result: AlignmentResult) -> None:
        labels = list(plots.score_heatmap(layout_result).data[0].x)
        assert "p12 post-norm" in labels  # real: the HF tuple's last entry
        assert "p11 post-norm (fitted)" in labels and "p12 post-norm (fitted)" not in labels

    def test_unconfident_slots_get_a_different_mark(self) -> None:
        result = align(SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture.pt", max_tokens=2)
        fig = plots.score_heatmap(result)
        names = [d.name for d in fig.data]
        assert "best guess (not confident)" in names and "chosen (confident)" not in names


class TestNormProfile:
    """The capture's norm grows with depth; each slot's norm line sits at its own level, marked at its match."""

    def test_capture_curve_and_slot_marks(self, layout_result: AlignmentResult) -> None:
        fig = plots.norm_profile(layout_result)
        assert fig.layout.yaxis.type == "log"
        capture = fig.data[0]
        ys = dict(zip(capture.x, capture.y))
        assert list(capture.x) == list(range(0, 12))  # raw p0..p11; p12 is only post-norm in an HF tuple
        assert ys[11] > ys[6] > ys[2]  # median norm grows with depth
        marks = [d for d in fig.data if d.mode == "markers" and d.showlegend is False]
        assert [int(d.x[0]) for d in marks] == [3, 7, 10, 12]
        for d, p in zip(marks[:3], (3, 7, 10)):  # each aux slot's level is the capture's level at its position
            assert d.y[0] == pytest.approx(ys[p], rel=0.02)

    def test_mean_is_swamped_by_the_first_token(self, layout_result: AlignmentResult) -> None:
        mean = dict(zip(*(lambda d: (d.x, d.y))(plots.norm_profile(layout_result, stat="mean").data[0])))
        median = dict(zip(*(lambda d: (d.x, d.y))(plots.norm_profile(layout_result).data[0])))
        assert mean[11] / mean[2] < median[11] / median[2]
        with pytest.raises(ForensicsError, match="stat"):
            plots.norm_profile(layout_result, stat="max")


class TestPerTokenCosine:
    """The chosen position's per-token curve sits at 1, neighbours below; one bad token stands out."""

    def test_chosen_and_neighbours(self, layout_result: AlignmentResult) -> None:
        fig = plots.per_token_cosine(layout_result, 1, neighbours=1)
        assert [d.name for d in fig.data] == ["p7 (chosen)", "p6", "p8"]
        chosen, *others = (np.array(d.y, dtype=float) for d in fig.data)
        assert chosen.min() > 0.999
        assert all(np.median(o) < 0.99 for o in others)
        assert not fig.layout.annotations  # no odd token out in clean data
        by_name = plots.per_token_cosine(layout_result, "hidden_states[1]", neighbours=2)
        assert [d.name for d in by_name.data] == ["p7 (chosen)", "p5", "p6", "p8", "p9"]

    def test_a_swapped_token_stands_out(self, layout_result: AlignmentResult) -> None:
        def swap(hs, d):
            hs[1][0, 20], hs[1][0, 21] = hs[1][0, 21].clone(), hs[1][0, 20].clone()
            return {**d, "hidden_states": hs}

        record = from_object(_record_from_samples(swap), "swapped.pt")
        result = align(record, load_capture(SAMPLES / "capture.pt"))
        assert result.matches[1].best == Position(7)
        fig = plots.per_token_cosine(result, 1)
        chosen = np.array(fig.data[0].y, dtype=float)
        assert set(np.flatnonzero(chosen < 0.99)) == {20, 21}
        assert len(fig.layout.annotations) == 1 and fig.layout.annotations[0].x in (20, 21)

    def test_position_and_token_range(self, layout_result: AlignmentResult) -> None:
        fig = plots.per_token_cosine(layout_result, 0, neighbours=0, position=Position(5), tokens=(10, 15))
        assert [d.name for d in fig.data] == ["p5"]
        assert list(fig.data[0].x) == [10, 11, 12, 13, 14]

    def test_bad_slot(self, layout_result: AlignmentResult) -> None:
        with pytest.raises(ForensicsError, match="no slot named"):
            plots.per_token_cosine(layout_result, "aux_hidden_state[9]")
        with pytest.raises(ForensicsError, match="out of range"):
            plots.per_token_cosine(layout_result, 7)


class TestFirstValuesTable:
    """The hand check: the first values of each slot next to the same tokens at its matched position."""

    def test_values_come_from_the_files(self, layout_result: AlignmentResult) -> None:
        record = load_training(SAMPLES / "record_layer_outputs.pt")
        capture = load_capture(SAMPLES / "capture.pt")
        df = plots.first_values_table(layout_result, record, capture, k=5)
        assert len(df) == 4 * 3 * 2  # 4 slots, first/middle/last token, training + capture rows
        raw = load_object(SAMPLES / "capture.pt")["hidden_states"]
        row = df[(df.slot == "hidden_states[1]") & (df.token == 20)]
        train, cap = row.iloc[0], row.iloc[1]
        assert train.side == "training row 20" and cap.side == "capture row 20" and cap.matched == "p7"
        ours = [train[f"v{j}"] for j in range(5)]
        theirs = [cap[f"v{j}"] for j in range(5)]
        np.testing.assert_allclose(ours, f32(record.entries[1].data[20, :5]).astype(np.float64))
        np.testing.assert_allclose(theirs, f32(raw[7][0, 20, :5]).astype(np.float64))
        assert df["max |diff|"].max() < 0.1  # bf16 record vs fp32 capture of the same state

    def test_wrong_position_shows_in_the_numbers(self, wrong_fix_result: AlignmentResult) -> None:
        df = plots.first_values_table(wrong_fix_result)  # reloads the inputs from the result's paths
        assert list(df.drop_duplicates("slot").matched) == ["p0", "p2", "p6", "p12 post-norm"]
        assert df["max |diff|"].max() < 0.1

    def test_reload_matches_given_objects(self, layout_result: AlignmentResult) -> None:
        record, capture = plots.load_inputs(layout_result)
        given = plots.first_values_table(layout_result, record, capture, k=3, tokens=[0, 5])
        reloaded = plots.first_values_table(layout_result, k=3, tokens=[0, 5])
        assert given.equals(reloaded) and len(given) == 4 * 2 * 2

    def test_other_record_is_refused(self, layout_result: AlignmentResult) -> None:
        other = from_object(_record_from_samples(lambda hs, d: {**d, "hidden_states": hs[:2]}), "two.pt")
        with pytest.raises(ForensicsError, match="not the ones the alignment placed"):
            plots.first_values_table(layout_result, other, load_capture(SAMPLES / "capture.pt"))


def test_input_strings_are_escaped_in_figures() -> None:
    """A hostile slot key and file name reach the figures only as escaped text."""
    obj = _record_from_samples(lambda hs, d: {**d, HOSTILE: hs[1][0]})
    record = from_object(obj, "<b onmouseover=alert(2)>.pt")
    result = align(record, load_capture(SAMPLES / "capture.pt"))
    assert result.matches[0].name == HOSTILE and result.matches[0].best == Position(7)
    figs = [plots.score_heatmap(result, highlight=(0, Position(7))), plots.norm_profile(result),
            plots.per_token_cosine(result, HOSTILE)]
    for fig in figs:
        text = json.dumps(fig.to_plotly_json(), default=str)
        assert "<script" not in text and "<b onmouseover" not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


class TestExplorer:
    """Changing a widget rebuilds the figures for the new selection."""

    def test_updates_follow_the_widgets(self, layout_result: AlignmentResult) -> None:
        pytest.importorskip("ipywidgets")
        from eagleforensics.report.explore import Explorer

        ex = Explorer(layout_result, draw=False)
        assert ex.selected_position == Position(3)
        assert ex.figures["per_token"].data[0].name == "p3"
        ex.slot.value = 2  # a new slot jumps to its own best position
        assert ex.selected_position == Position(10)
        assert ex.figures["per_token"].data[0].name == "p10"
        assert ex.figures["heatmap"].data[-1].name == "selected"
        assert list(ex.figures["heatmap"].data[-1].y) == ["hidden_states[2]"]
        assert ex.figures["profile"].data[-2].line.width == 1.5 and max(
            d.line.width or 0 for d in ex.figures["profile"].data if d.mode == "lines") == 4
        ex.tokens.value = (5, 9)
        assert list(ex.figures["per_token"].data[0].x) == [5, 6, 7, 8, 9]
        ex.position.value = layout_result.columns.index(Position(9))
        assert ex.figures["per_token"].data[0].name == "p9"
        ex.neighbours.value = 0
        assert len(ex.figures["per_token"].data) == 1
