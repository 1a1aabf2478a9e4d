"""The target-agreement pass (``agreement.TargetHead.score``) on a torch device: the same sums, on a GPU.

``--device cuda`` puts the audit's lm_head products there: the head is copied to the device once (stored
dtype, block by block: ``drafter.replay.head_on``), each vocabulary block widened there, and the running
max, log-sum-exp, moments, rank and the 16 temperatures' sums are the numpy pass's, step for step, in
float32 logits and float64 sums. Float order differs from the numpy pass (GPU reductions): figures agree to
about 1e-6 relative (``tests/test_scale_work.py`` holds them to 1e-5 on the CPU, where this path also runs).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .scoresums import finish_scores

VOCAB_ROWS = 8192  # lm_head rows widened at once on the device


def score_block(head: Any, x: np.ndarray, nxt: np.ndarray, ztrue: np.ndarray, out: Any, device: str,
                temperatures: tuple[float, ...]) -> None:
    """``TargetHead._score_block`` for all of ``x`` at once on ``device`` (the head streamed once per call).

    ``head`` is ``agreement.TargetHead``, ``out`` its ``TokenScores`` and ``temperatures`` its ``TEMPERATURES``,
    handed in by the caller: ``agreement`` imports this module, so this one does not import it back."""
    from ..io.diskrows import disk_rows, head_block
    from ..drafter.replay import head_on

    dev = torch.device(device)
    w_all = head_on(_rows(head, disk_rows), dev)
    xt = torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(dev)
    n = xt.shape[0]
    f64 = torch.float64
    m = torch.full((n,), -torch.inf, dtype=f64, device=dev)
    centre: torch.Tensor | None = None
    s0 = torch.zeros(n, dtype=f64, device=dev)
    s1 = torch.zeros_like(s0)
    s2 = torch.zeros_like(s0)
    above = torch.zeros(n, dtype=torch.long, device=dev)
    inv_t = [1.0 / t for t in temperatures]
    st = torch.zeros(n, len(inv_t), dtype=f64, device=dev)
    sa = torch.zeros_like(st)
    nx = torch.from_numpy(nxt).to(dev)
    zt32 = torch.from_numpy(ztrue.astype(np.float32)).to(dev)
    rows = torch.arange(n, device=dev)
    cap = head.spec.softcap
    vocab = head.spec.vocab
    for v0 in range(0, vocab, VOCAB_ROWS):
        v1 = min(vocab, v0 + VOCAB_ROWS)
        z = xt @ head_block(w_all, v0, v1).to(torch.float32).T
        if cap is not None:
            z = cap * torch.tanh(z / cap)
        own = (nx >= v0) & (nx < v1)
        gt = z > zt32[:, None]
        if bool(own.any()):
            gt[rows[own], nx[own] - v0] = False
        above += gt.sum(1)
        cm = z.max(1).values.to(f64)
        new = torch.maximum(m, cm)
        if centre is None:
            centre = new.clone()
        scale = torch.exp(m - new)
        shift = z - new[:, None].to(torch.float32)
        for g, k in enumerate(inv_t):
            rescale = torch.exp((m - new) * k)
            e_t = torch.exp(shift * np.float32(k))
            st[:, g] = st[:, g] * rescale + e_t.sum(1, dtype=f64)
            e_t *= gt
            sa[:, g] = sa[:, g] * rescale + e_t.sum(1, dtype=f64)
        del shift, e_t
        z -= centre[:, None].to(torch.float32)
        e = torch.exp(z - (new - centre)[:, None].to(torch.float32))
        s0 = s0 * scale + e.sum(1, dtype=f64)
        e *= z
        s1 = s1 * scale + e.sum(1, dtype=f64)
        e *= z
        s2 = s2 * scale + e.sum(1, dtype=f64)
        m = new
    finish_scores(*(t.cpu().numpy() for t in (m, centre, s0, s1, s2, above, st, sa)), ztrue, nxt, out,
                  1.0 / np.asarray(temperatures))


def _rows(head: Any, disk_rows: object) -> object:
    """The head's lm_head as ``DiskRows`` (one per scorer, so the device copy is made once)."""
    cached = head.__dict__.get("_disk_head")
    if cached is None:
        cached = head.__dict__["_disk_head"] = disk_rows(head.model, head.spec.head)  # type: ignore[operator]
    return cached
