"""Property-based contracts of the loaders and the matcher (hypothesis, small fixed budgets).

* Any edit of a real sample file ends in a result or a one-line ForensicsError naming the
  file; never another exception.
* A confident placement is a true statement: recomputed independently (float64 per-token
  cosine against the clean states) it clears the bar, and it sits where the clean run puts
  the slot, unless the edit turned the capture into a valid sweep of another depth.
* Corruption is never hidden: when a bit flip changes a slot's values beyond the bf16
  tolerance in the compared rows, the reported max abs error grows by at least the change
  and the score does not rise; new NaN/Inf rows are named in a finding.
* Random layouts, shapes, dtypes and token counts cut from a real forward pass: a result or
  a clean error, and every confident placement is the position the data was cut from.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagleforensics.alignment import align
from eagleforensics.arrays import is_float, to_torch
from eagleforensics.io.capture import load_capture
from eagleforensics.errors import ForensicsError
from eagleforensics.positions import Position
from eagleforensics.io.training import load_training

from .mutations import Case, Edit, baseline, cases, relabelled, run_case, sample_path, wrong_placements, write_case
from .realdata import N, forward

FAST = settings(deadline=None, database=None, derandomize=True, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BF16_RTOL, BF16_ATOL = 1.6e-2, 1e-5  # torch.testing.assert_close defaults for bfloat16


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mutated")


def _one_line_naming(exc: ForensicsError, path: Path) -> None:
    text = str(exc)
    assert "\n" not in text and text.strip()
    assert exc.path is None or exc.path in (str(path), str(path.parent)) or "capture" in text, text


# ---------------------------------------------------------------- loaders

@settings(FAST, max_examples=150)
@given(case=cases(max_edits=3))
def test_loaders_give_a_record_or_a_clean_error(case: Case, scratch: Path) -> None:
    train, capture = write_case(case, scratch)
    path = train if case.side == "train" else capture
    try:
        if case.side == "train":
            rec = load_training(path)
            assert rec.entries and all(isinstance(e.data, np.ndarray) and is_float(e.data.dtype) for e in rec.entries)
        else:
            cap = load_capture(path)
            for pos in cap.positions:
                t = cap.read(pos)
                assert tuple(t.shape) == (cap.num_tokens, cap.hidden_size) and isinstance(t, np.ndarray) and is_float(t.dtype)
    except ForensicsError as exc:
        _one_line_naming(exc, path)


# ---------------------------------------------------------------- whole pipeline, any edit

@settings(FAST, max_examples=150)
@given(case=cases(max_edits=3))
def test_align_on_edited_files_is_a_result_or_a_clean_error(case: Case, scratch: Path) -> None:
    out = run_case(case, scratch / "any")
    assert out.kind in ("result", "clean-error"), out.detail
    if out.kind == "result":
        clean = baseline(case.train, case.capture, str(scratch / "clean"))
        if not relabelled(out.result, clean):
            assert wrong_placements(out.result, clean) == []


# ---------------------------------------------------------------- bit flips: corruption is visible

def _per_token(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Per-token cosine in float64; NaN where either side is not finite."""
    y, x = y.double(), x.double()
    ok = torch.isfinite(y).all(-1) & torch.isfinite(x).all(-1)
    y, x = torch.where(ok[:, None], y, 0.0), torch.where(ok[:, None], x, 0.0)
    cos = (y * x).sum(-1) / (y.norm(dim=-1) * x.norm(dim=-1)).clamp_min(1e-30)
    return torch.where(ok, cos, float("nan"))


def _ref_score(y: torch.Tensor, x: torch.Tensor) -> float:
    """Mean per-token cosine over tokens finite on both sides (NaN if none)."""
    return float(torch.nanmean(_per_token(y, x)))


def _rows(result, slot_rows, cap_rows) -> tuple[torch.Tensor, torch.Tensor]:
    """The aligned rows of a slot and a capture position (arrays from io) as torch tensors."""
    t = result.tokens
    return (to_torch(slot_rows[t.train_start:t.train_start + t.length]),
            to_torch(cap_rows[t.capture_start:t.capture_start + t.length]))


def _check_truthful(result, slots: dict[str, torch.Tensor], cap) -> None:
    """Every confident placement at a stored column re-scores as reported; below the bar it never claims a copy.

    Identity is judged from robust evidence (evidence.identity), so a slot with a few damaged
    rows stays placed; its fidelity then says drift and the rows are named (checked below).
    """
    for m in result.matches:
        if not m.confident or m.position not in cap.positions:
            continue
        y, x = _rows(result, slots[m.name], cap.read(m.position))
        ref = _ref_score(y, x)
        assert ref >= result.thresholds.min_score - 1e-6 or m.fidelity == "drift", (m.name, m.position.label, ref)
        # a row whose squared norm overflows float32 (a flipped exponent bit) scores 0 in the float32 scorer
        over = int((torch.linalg.vector_norm(y.float(), dim=-1).square() == float("inf")).sum())
        assert abs(ref - m.score) < 2e-6 + over / max(1, y.shape[0]), (m.name, ref, m.score)


def _messages(result, code: str) -> str:
    return " | ".join(f.message for f in result.findings if f.code == code)


@settings(FAST, max_examples=80)
@given(case=cases(sides=("train",), flips_only=True))
def test_a_bit_flip_in_a_record_is_never_hidden(case: Case, scratch: Path) -> None:
    """Placed slots keep honest evidence: score, damaged rows, max abs error, NaN rows all show the flip."""
    out = run_case(case, scratch / "flip_train")
    assert out.kind in ("result", "clean-error"), out.detail
    if out.kind != "result":
        return
    s = scratch / "clean"
    clean = baseline(case.train, case.capture, str(s))
    cap = load_capture(sample_path(case.capture, s))
    mutated = {sl.name: sl.data for sl in out.record.slots(cap.hidden_size)}
    original = {sl.name: sl.data for sl in load_training(sample_path(case.train, s)).slots(cap.hidden_size)}
    _check_truthful(out.result, mutated, cap)
    before = {m.name: m for m in clean.matches}
    for m in out.result.matches:
        c = before.get(m.name)
        if c is None or mutated[m.name].shape != original[m.name].shape:
            continue
        new_bad = ~torch.isfinite(to_torch(mutated[m.name])).all(-1) & torch.isfinite(to_torch(original[m.name])).all(-1)
        for row in new_bad.nonzero().flatten().tolist():
            assert f"{m.name}: " in _messages(out.result, "nonfinite-training"), (m.name, row)
            assert str(row) in _messages(out.result, "nonfinite-training"), (m.name, row)
        if not (m.confident and m.position == c.position and m.position in cap.positions):
            continue
        y, y0 = _rows(out.result, mutated[m.name], original[m.name])
        _, x = _rows(out.result, mutated[m.name], cap.read(m.position))
        per, per0 = _per_token(y, x), _per_token(y0, x)
        damaged = (per < out.result.thresholds.min_score - 1e-5).nonzero().flatten().tolist()
        for j in damaged:  # a row that no longer matches the placed position is named
            assert f"row{'s' if len(damaged) > 1 else ''} " in _messages(out.result, "rows-differ")
            assert str(out.result.tokens.train_start + j) in _messages(out.result, "rows-differ"), (m.name, j)
        if abs(float(torch.nanmean(per)) - float(torch.nanmean(per0))) > 4e-6:
            assert m.score != c.score, (m.name, m.score)  # the evidence moved, so the score moved
        both = torch.isfinite(y).all(-1, keepdim=True) & torch.isfinite(y0)
        delta = torch.where(both, (y.double() - y0.double()).abs(), 0.0)
        beyond = delta > BF16_ATOL + BF16_RTOL * y0.double().abs()
        if bool(beyond.any()):  # the max abs error grows by at least the change, the score does not rise
            worst = float(delta[beyond].max())
            assert m.max_abs_err >= worst - c.max_abs_err - 1e-3 * worst, (m.name, worst, m.max_abs_err)
            assert m.score <= c.score + 1e-6, (m.name, m.score, c.score)


def test_a_damaged_row_in_a_placed_slot_is_named(tmp_path: Path) -> None:
    """One row pushed off its state: the slot stays placed, the finding names the row."""
    rec = torch.load(sample_path("record_layer_outputs.pt", tmp_path), weights_only=True)
    hs = [h.clone() for h in rec["hidden_states"]]
    hs[2][0, 17, 5] += 0.1
    rec["hidden_states"] = hs
    torch.save(rec, tmp_path / "damaged.pt")
    r = align(tmp_path / "damaged.pt", sample_path("capture.pt", tmp_path))
    assert r.matches[2].confident and r.matches[2].position == Position(10)
    msg = _messages(r, "rows-differ")
    assert msg.startswith("hidden_states[2] is placed at p10, but 1 of its 40 compared rows differs") and "(row 17;" in msg
    assert _messages(align(sample_path("record_layer_outputs.pt", tmp_path), sample_path("capture.pt", tmp_path)),
                     "rows-differ") == ""


@settings(FAST, max_examples=80)
@given(case=cases(sides=("capture",), flips_only=True))
def test_a_bit_flip_in_a_capture_never_moves_a_slot_confidently(case: Case, scratch: Path) -> None:
    out = run_case(case, scratch / "flip_capture")
    assert out.kind in ("result", "clean-error"), out.detail
    if out.kind != "result":
        return
    s = scratch / "clean"
    clean = baseline(case.train, case.capture, str(s))
    if not relabelled(out.result, clean):
        assert wrong_placements(out.result, clean) == []
    train, capture = write_case(case, scratch / "flip_capture")
    cap = load_capture(capture)
    _check_truthful(out.result, {sl.name: sl.data for sl in out.record.slots(cap.hidden_size)}, cap)


# ---------------------------------------------------------------- random layouts cut from a real run

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@st.composite
def records(draw: st.DrawFn) -> tuple[dict, list[int]]:
    """A training object cut from a real forward pass, and the positions of its aux slots."""
    run = forward("llama")
    aux = sorted(draw(st.sets(st.integers(1, N - 1), min_size=1, max_size=4)))
    tokens = draw(st.integers(1, 32))
    dtype = draw(st.sampled_from(DTYPES))
    layout = draw(st.sampled_from(("list", "specforge", "speculators", "modelopt", "generic")))
    with_ids = draw(st.booleans())
    states = [run.p(p)[:tokens].to(dtype) for p in aux]
    final = run.hs[N][:tokens].to(dtype)
    ids = run.ids[:tokens].clone()
    if layout == "list":
        obj: dict = {"hidden_states": [s.clone() for s in states] + [final.clone()]}
    elif layout == "specforge":
        obj = {"aux_hidden_state": torch.cat(states, -1)[None].clone(), "hidden_state": final[None].clone(),
               "loss_mask": torch.ones(tokens, dtype=torch.int64)}
    elif layout == "speculators":
        obj = {"hidden_states": torch.stack(states + [final], 1).clone()}
        with_ids = True
    elif layout == "modelopt":
        obj = {"aux_hidden_states": torch.cat(states, -1).clone(), "hidden_states": final.clone()}
    else:
        obj = {f"layer_{p}": s.clone() for p, s in zip(aux, states)}
    if with_ids:
        obj["token_ids" if layout == "speculators" else "input_ids"] = ids
    return obj, aux


@settings(FAST, max_examples=60)
@given(rec=records(), cap_dtype=st.sampled_from(DTYPES), batch=st.booleans())
def test_random_layouts_and_dtypes_are_placed_truly_or_not_at_all(rec, cap_dtype, batch, scratch: Path) -> None:
    obj, aux = rec
    run = forward("llama")
    hs = [h.to(cap_dtype) for h in run.hs]
    capture = {"hidden_states": [h[None].clone() if batch else h.clone() for h in hs], "input_ids": run.ids.clone()}
    torch.save(obj, scratch / "rec.pt")
    torch.save(capture, scratch / "cap.pt")
    try:
        r = align(scratch / "rec.pt", scratch / "cap.pt")
    except ForensicsError as exc:
        assert "\n" not in str(exc)
        return
    truth = {Position(p) for p in aux} | {Position(N, True)}
    for m in r.matches:
        if m.confident:
            assert m.position in truth, (m.name, m.position)
            assert m.tokens >= 4
    placed = [m.position.p for m in r.matches if m.confident and m.role == "aux"]
    assert placed == sorted(placed)


@st.composite
def odd_tensors(draw: st.DrawFn) -> torch.Tensor:
    """Real hidden-state values in shapes and dtypes a loader must refuse or accept cleanly."""
    run = forward("llama")
    base = run.p(3)
    shape = draw(st.sampled_from(("T", "TH", "1TH", "2TH", "T0", "0H", "TLH", "1x1TH", "scalar")))
    t = {"T": base[:, 0], "TH": base, "1TH": base[None], "2TH": torch.stack([base, base]), "T0": base[:, :0],
         "0H": base[:0], "TLH": torch.stack([base, base], 1), "1x1TH": base[None, None], "scalar": base[0, 0]}[shape]
    dtype = draw(st.sampled_from((*DTYPES, torch.int64, torch.int8, torch.bool, torch.complex64)))
    return t.to(dtype).clone()


@settings(FAST, max_examples=80)
@given(t=odd_tensors(), where=st.sampled_from(("train-list", "train-tensor", "capture-entry", "capture-key")))
def test_odd_shapes_and_dtypes_are_a_result_or_a_clean_error(t: torch.Tensor, where: str, scratch: Path) -> None:
    run = forward("llama")
    train = {"hidden_states": [run.p(3).clone(), run.hs[N].clone()], "input_ids": run.ids.clone()}
    capture = {"hidden_states": [h.clone() for h in run.hs], "input_ids": run.ids.clone()}
    if where == "train-list":
        train["hidden_states"][0] = t
    elif where == "train-tensor":
        train = {"layer_3": t}
    elif where == "capture-entry":
        capture["hidden_states"][5] = t
    else:
        capture = {f"layers.{i}": h.clone() for i, h in enumerate(run.hs)}
        capture["layers.5"] = t
    torch.save(train, scratch / "odd_rec.pt")
    torch.save(capture, scratch / "odd_cap.pt")
    try:
        r = align(scratch / "odd_rec.pt", scratch / "odd_cap.pt")
    except ForensicsError as exc:
        assert "\n" not in str(exc)
        return
    for m in r.matches:  # whatever survived must still be placed truthfully
        if m.confident and m.key in ("hidden_states", "layer_3") and m.index in (0, None):
            assert m.position == Position(3) or (m.role == "final" and m.position == Position(N, True))
    assert all(math.isfinite(m.score) or not m.confident for m in r.matches)


def test_a_capture_shifted_mid_file_never_places_a_slot_next_to_corrupted_neighbours(scratch: Path) -> None:
    """Found by the round-three fuzz: 11 bytes deleted early and inserted late in the capture sweep, so the
    positions between are shifted garbage with NaN rows. The embedding (intact) then sat 'far' from its
    corrupted neighbour p1, and aux_hidden_state[0] (truly p2, itself corrupted) was placed at p0 'under
    drift'; a neighbour with non-finite rows now counts as not captured whole."""
    case = Case(train="data_0.ckpt", capture="capture_sweep.safetensors", side="capture",
                edits=(Edit("insert", 0.99814, 11, 11), Edit("delete", 0.13829, 0, 11)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run_case(case, scratch / "shifted_capture")
    assert out.kind == "result", out.detail
    # the garbage rows once overflowed numpy's norms, whose warnings the CLI printed under its answer
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]
    clean = baseline(case.train, case.capture, str(scratch / "clean"))
    assert any(f.code == "nonfinite-capture" for f in out.result.findings)  # the corruption is visible
    assert wrong_placements(out.result, clean) == []
    placed = {m.name: m.identity_verdict for m in out.result.matches}
    # its best, the intact embedding p0, sits at 4.5x the slot's norm: no drift does that (fidelity.DRIFT_NORM_LIMIT)
    assert placed["aux_hidden_state[0]"] == "none"
    reason = next(m.reason for m in out.result.matches if m.name == "aux_hidden_state[0]")
    assert "best p0" in reason and "a drifted copy keeps its norm" in reason, reason


def test_a_post_norm_slot_is_never_placed_as_raw_drift_when_the_capture_s_final_is_corrupted(scratch: Path) -> None:
    """Found by the fuzz of the final main: 8 bytes inserted in the header's padding and 8 deleted a third
    into the sweep, so p0, p1, p10 and p11 (stored first) are shifted by 4 values and garbage, and so is the
    stored post-norm final. The record's post-norm final then matched raw p12 at 0.91, with its step to the
    garbage p11 looking huge, and was placed there as uniform drift, 'the raw last-layer output': confidently
    wrong. Its norms are 31x p12's: drift does not do that, so it is now not placed at all."""
    case = Case(train="record_layer_outputs.pt", capture="capture_sweep.safetensors", side="capture",
                edits=(Edit("insert", 0.004747847179157021, 0, 8), Edit("delete", 1 / 3, 0, 8)))
    out = run_case(case, scratch / "shifted_final")
    assert out.kind == "result", out.detail
    clean = baseline(case.train, case.capture, str(scratch / "clean"))
    assert next(m for m in clean.matches if m.name == "hidden_states[3]").position == Position(12, True)
    assert wrong_placements(out.result, clean) == []
    final = next(m for m in out.result.matches if m.name == "hidden_states[3]")
    assert not final.confident and final.fidelity == "different" and final.fidelity_cause == "norms", final
    assert final.norm_ratio > 10, final.norm_ratio
    assert not any(f.code == "final-raw" for f in out.result.findings)
    placed = {m.name: m.position for m in out.result.matches if m.confident}
    assert placed == {"hidden_states[0]": Position(3), "hidden_states[1]": Position(7)}  # the intact ones stay


def test_a_record_that_lost_a_list_entry_is_judged_by_content(scratch: Path) -> None:
    """Found by the fuzz of the final main: 59 bytes cut from the pickle of the 4-entry list record drop its
    third entry (p10), leaving [p3, p7, p12 post-norm], each placed right as a copy. The oracle compared by
    name ('hidden_states[2] is p10') and called it wrong; now a record with fewer slots is judged by content,
    and a placement at a position the clean record does not hold still counts as wrong."""
    from types import SimpleNamespace as NS

    case = Case(train="record_layer_outputs.pt", capture="capture_sweep.safetensors", side="train",
                edits=(Edit("delete", 0.5, 0, 59),), layer="pickle")
    out = run_case(case, scratch / "dropped_entry")
    assert out.kind == "result", out.detail
    clean = baseline(case.train, case.capture, str(scratch / "clean"))
    got = [(m.name, m.position, m.confident) for m in out.result.matches]
    assert len(clean.matches) == 4 and got == [("hidden_states[0]", Position(3), True),
                                               ("hidden_states[1]", Position(7), True),
                                               ("hidden_states[2]", Position(12, True), True)]
    assert wrong_placements(out.result, clean) == []
    wrong = NS(matches=[*out.result.matches[:2], NS(name="hidden_states[2]", position=Position(9), confident=True)])
    assert wrong_placements(wrong, clean) == ["hidden_states[2]: p9 (clean record holds ['p10', 'p12 post-norm', "
                                              "'p3', 'p7'])"]
