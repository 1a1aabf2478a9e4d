"""Streaming scorer: same numbers as a plain per-position loop, rows read from files, bounded reads, errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from eagleforensics.arrays import to_torch
from eagleforensics.evidence import match
from eagleforensics.alignment import align
from eagleforensics.arrays import BF16, as_array
from eagleforensics.io.capture import load_capture
from eagleforensics.evidence.confidence import choose, thresholds
from eagleforensics.errors import ForensicsError
from eagleforensics.io.filerows import FileRows, PositionSource
from eagleforensics.evidence.norms import fit_gain, unit_rms
from eagleforensics.positions import Position
from eagleforensics.io.sweep import write_capture

from .realdata import N, SAMPLES, _model, forward


def reference_scores(slots, fit, positions, read, ts, cs, length):
    """The plain loop the streaming scorer replaces: each position whole, in float32, cell by cell."""
    positions = sorted(positions)
    have = set(positions)
    virt = [Position(p.p, True) for p in positions if any(fit) and not p.normed and Position(p.p, True) not in have]
    columns = sorted(have | set(virt))
    score = np.full((len(slots), len(columns)), np.nan)
    ys = [s[ts:ts + length].float() for s in slots]
    y_ok = [torch.isfinite(y).all(-1) for y in ys]
    ys = [torch.where(ok.unsqueeze(-1), y, 0.0) for y, ok in zip(ys, y_ok)]
    for pos in positions:
        x = to_torch(read(pos)[cs:cs + length]).float()
        x_ok = torch.isfinite(x).all(-1)
        x = torch.where(x_ok.unsqueeze(-1), x, 0.0)
        for i, y in enumerate(ys):
            ok = x_ok & y_ok[i]
            cos = torch.nn.functional.cosine_similarity(y, x, dim=-1, eps=1e-30)
            score[i, columns.index(pos)] = float(cos[ok].double().mean())
            if fit[i] and Position(pos.p, True) in virt:
                gain = torch.from_numpy(fit_gain(torch.where(ok.unsqueeze(-1), y, 0.0)[None], x)[0])
                pred = gain * torch.from_numpy(unit_rms(x))
                sim = 2 * (y * pred).sum(-1) / (y.square().sum(-1) + pred.square().sum(-1)).clamp_min(1e-30)
                score[i, columns.index(Position(pos.p, True))] = float(sim[ok].double().mean())
    return columns, score


@pytest.fixture(scope="module")
def qwen():
    return forward("qwen3")


def _bf16(t):
    return t.to(torch.bfloat16).contiguous()


def _captures(tmp_path, run):
    """The same real sweep as an HF-tuple .pt, the capture helper's safetensors and a per-file directory."""
    torch.save({"hidden_states": [h[None] for h in run.hs], "input_ids": run.ids.clone()}, tmp_path / "hf.pt")
    write_capture(tmp_path / "sweep.safetensors", run.sweep, _model(run.family, 0), dtype="bfloat16")
    d = tmp_path / "dir"
    d.mkdir()
    for p in range(N + 1):
        save_file({"h": run.p(p).contiguous()}, str(d / f"layer_{p}.safetensors"))
    return [(tmp_path / "hf.pt", "hf"), (tmp_path / "sweep.safetensors", "hf"), (d, "vllm")]


def _slots(run, nan_row=None):
    slots = [_bf16(run.p(p)) for p in (2, N // 2 + 1, N - 2)] + [_bf16(run.hs[N])]
    if nan_row is not None:
        slots[1] = slots[1].clone()
        slots[1][nan_row] = float("nan")
    return slots


@pytest.mark.parametrize("window", [(0, 0, 32), (3, 5, 20)])
def test_streaming_scores_equal_the_plain_loop_on_every_reader(tmp_path, qwen, window):
    """Exact mode (every fitted column): the token-major sweep reproduces the per-position loop's scores."""
    ts, cs, length = window
    slots = _slots(qwen, nan_row=7)
    fit = [False, False, False, True]
    for path, conv in _captures(tmp_path, qwen):
        cap = load_capture(path, convention=conv, num_layers=N)
        assert cap.streams
        sm = match.score_slots(slots, fit, cap.positions, cap, ts, cs, length, fit_candidates=None)
        cols, ref = reference_scores(slots, fit, cap.positions, cap.read, ts, cs, length)
        assert sm.columns == cols
        assert np.array_equal(np.isnan(sm.score), np.isnan(ref))
        assert np.nanmax(np.abs(sm.score - ref)) < 1e-5
        direct = [cols.index(p) for p in cap.positions]
        assert (sm.tokens_used[1, direct] == length - (1 if ts <= 7 < ts + length else 0)).all()


def test_default_mode_fits_only_candidate_positions_and_chooses_the_same(tmp_path, qwen):
    """Fitted columns at the few raw positions a post-norm slot resembles: same choice, others not computed."""
    slots = _slots(qwen)
    fit = [False, False, False, True]
    path, conv = _captures(tmp_path, qwen)[0]
    cap = load_capture(path, convention=conv)
    sm = match.score_slots(slots, fit, cap.positions, cap, 0, 0, 32)
    cols, ref = reference_scores(slots, fit, cap.positions, cap.read, 0, 0, 32)
    fitted = [j for j, c in enumerate(cols) if c.normed and c.p < N]
    assert 0 < np.isfinite(sm.score[3, fitted]).sum() <= match.FIT_CANDIDATES < len(fitted)
    done = np.isfinite(sm.score)
    assert np.nanmax(np.abs(sm.score[done] - ref[done])) < 1e-5
    bar = thresholds(torch.bfloat16)
    for i in range(4):
        a = choose(sm.score[i], sm.norm_ratio[i], cols, 32, bar)
        b = choose(ref[i], sm.norm_ratio[i], cols, 32, bar)
        assert (a.best, a.runner_up, a.confident) == (b.best, b.runner_up, b.confident)


def test_scoring_reads_rows_never_whole_positions(tmp_path, qwen, monkeypatch):
    """The scorer goes through row reads; the whole-position reader is never called on streamable captures."""
    for path, conv in _captures(tmp_path, qwen):
        cap = load_capture(path, convention=conv, num_layers=N)
        pos = cap.positions[3]
        assert np.array_equal(cap.read_rows(pos, 4, 9), cap.read(pos)[4:9])

        def refuse(self):
            raise AssertionError("whole position read")

        monkeypatch.setattr(PositionSource, "__call__", refuse)
        sm = match.score_slots(_slots(qwen), [False] * 3 + [True], cap.positions, cap, 0, 0, 32)
        assert np.isfinite(sm.score).any() and np.isfinite(sm.max_abs).sum() == 4
        monkeypatch.undo()


def test_pt_captures_read_rows_from_the_file_not_the_mapping(tmp_path, qwen):
    """A zip .pt capture's positions get file-offset row readers (mapped pages would pile up in RSS)."""
    path, _ = _captures(tmp_path, qwen)[0]
    cap = load_capture(path)
    src = cap.readers[Position(3)]
    assert isinstance(src, PositionSource) and isinstance(src._rows.__self__, FileRows)
    assert np.array_equal(cap.read_rows(Position(3), 0, 32), as_array(qwen.hs[3]))


def test_file_rows_scatter_into_a_strided_buffer(tmp_path, qwen):
    """One scatter read fills one position's column of a [rows, positions, H] buffer, leaving the rest."""
    x = _bf16(qwen.hs[5])
    save_file({"x.5": x}, str(tmp_path / "x.safetensors"))
    cap = load_capture(tmp_path / "x.safetensors", convention="vllm")
    buf = np.zeros((10, 3, x.shape[1]), dtype=BF16)
    got = cap.read_rows(cap.positions[0], 20, 30, out=buf[:, 1])
    assert got.__array_interface__["data"] == buf[:, 1].__array_interface__["data"]
    assert buf[:, 1].tobytes() == as_array(x[20:30]).tobytes() and not buf[:, 0].any() and not buf[:, 2].any()


def test_a_capture_that_changes_after_opening_is_a_one_line_error(tmp_path, qwen):
    path = tmp_path / "sweep.safetensors"
    write_capture(path, qwen.sweep, _model("qwen3", 0), dtype="bfloat16")
    cap = load_capture(path)
    with path.open("r+b") as fh:
        fh.truncate(path.stat().st_size // 2)
    with pytest.raises(ForensicsError, match="changed after it was opened"):
        align(_record(tmp_path, qwen), cap)


def _record(tmp_path, run):
    torch.save({"hidden_states": _slots(run), "input_ids": run.ids.clone()}, tmp_path / "rec.pt")
    return tmp_path / "rec.pt"


def test_device_cuda_without_a_gpu_is_refused_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ForensicsError, match="sees no CUDA GPU"):
        align(SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture.pt", device="cuda")
    assert match.resolve_device("auto") == "cpu"


def test_samples_keep_their_verdicts():
    """Existing behaviour on data_samples: p = 3, 7, 10 and the post-norm p12, all confident."""
    r = align(SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture.pt")
    assert [(m.position.p, m.position.normed) for m in r.matches] == [(3, False), (7, False), (10, False), (12, True)]
    assert all(m.confident for m in r.matches) and r.level == "ACTION"  # placed; ids must be written
    assert all(np.isfinite(m.max_abs_err) for m in r.matches)


def test_neighbour_products_do_not_depend_on_the_order_positions_arrive():
    """GPU readers finish out of order: each row's product with the position below is still its own."""
    import random

    from eagleforensics.evidence.gpu import _neighbour_products
    from eagleforensics.evidence.steps import lower_neighbours

    run = forward("qwen3")
    positions = [Position(p) for p in (0, 1, 2, 4, 5, 6)] + [Position(N, True)]  # a gap at 3, a normed last
    xs = [run.p(p.p).float() if not p.normed else run.hs[N].float() for p in positions]
    below = lower_neighbours(positions)
    want = torch.full((len(xs), xs[0].shape[0]), float("nan"))
    for g in range(1, len(xs)):
        if below[g]:
            want[g] = (xs[g] * xs[g - 1]).sum(-1)
    for seed in range(5):
        order = list(range(len(xs)))
        random.Random(seed).shuffle(order)
        adj = torch.full_like(want, float("nan"))
        held: dict = {}
        seen: set = set()
        for g in order:
            _neighbour_products(g, xs[g], below, held, seen, adj)
        assert not held and torch.allclose(adj, want, equal_nan=True, rtol=1e-5), order
