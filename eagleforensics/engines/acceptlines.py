"""Acceptance against batch size, uptime and cached share, from a parsed server log (docs/causes.md rows 31, 34, 35).

A healthy drafter accepts about as much at 64 running requests as at 1 (sgl-project/sglang#16818) and as much
after two hours as after two minutes. ``batch_trend`` regresses accept length on log2(running requests);
``uptime_trend`` on the time since the first decode line, with the share of prompt tokens served from cache
(SGLang's ``Prefill batch`` lines: ``#new-token: N, #cached-token: C``, scheduler_metrics_mixin.py 0.5.4 -
0.5.9, observability/ 0.5.10 - 0.5.12, scheduler_components/metrics_reporter.py 0.5.23) and a recovery after
a flush. ``spec_off_lines`` picks the decode lines a run-time setting explains (accept length 1.00 where the
engine drafted nothing). Rank correlations are Spearman's (ranks, then Pearson), so no line's size dominates.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .loglines import read_lines

ONE = 1.005  # an accept length at or below this is 1.00 as printed
MIN_LINES = 8  # fewer decode lines than this and no trend is said
MIN_SPAN = 4.0  # the batch sizes must span at least this ratio (two doublings)
_PREFILL = re.compile(r"Prefill batch(?: \[\d+\])?[.,] .*?#new-token: (\d+), #cached-token: (\d+)")
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)?[^\]]*\]")


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when either side is constant."""
    rx, ry = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()
    if np.std(rx) == 0 or np.std(ry) == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def decode_points(df: pd.DataFrame) -> pd.DataFrame:
    """The log's speculative decode lines with their running requests: columns time, line, running, accept.

    vLLM prints running requests on the throughput line before each SpecDecoding line: carried forward."""
    if df.empty:
        return pd.DataFrame(columns=["time", "line", "running", "accept"])
    running = df["running_req"].astype("Float64")
    if (df["engine"] == "vllm").any():
        running = running.ffill()
    out = pd.DataFrame({"time": df["time"], "line": df["line"], "running": running,
                        "accept": df["accept_length"].astype("float64")})
    out = out[out["accept"].notna() & (out["accept"] >= 1.0)]
    return out[~(out["running"].fillna(1) == 0)].reset_index(drop=True)


@dataclass(frozen=True)
class Trend:
    """Accept length against one variable: lines used, rank correlation, the fitted accept length at both ends
    and the share of the gain over 1 lost between them."""

    lines: int
    rho: float
    start: float
    end: float
    low: float  # the variable at the start (batch size, minutes)
    high: float

    @property
    def lost(self) -> float:
        """Share of the start's gain over accept length 1 gone at the end (0: flat; negative: rises)."""
        return (self.start - self.end) / (self.start - 1.0) if self.start > 1.0 else math.nan

    def falls(self, min_lost: float = 0.3, max_rho: float = -0.6) -> bool:
        return math.isfinite(self.rho) and self.rho <= max_rho and math.isfinite(self.lost) and self.lost >= min_lost

    def to_dict(self) -> dict[str, Any]:
        def num(v: float) -> float | None:
            return round(v, 4) if math.isfinite(v) else None
        return {"lines": self.lines, "rho": num(self.rho), "start": num(self.start), "end": num(self.end),
                "low": num(self.low), "high": num(self.high), "lost": num(self.lost)}


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    slope, icept = np.polyfit(x, y, 1)
    return float(icept + slope * x.min()), float(icept + slope * x.max())


def batch_trend(points: pd.DataFrame) -> Trend | None:
    """Accept length regressed on log2(running requests); None below ``MIN_LINES`` lines or a batch span under
    ``MIN_SPAN``."""
    p = points[points["running"].notna()]
    if len(p) < MIN_LINES:
        return None
    b = p["running"].astype("float64").to_numpy()
    if b.min() <= 0 or b.max() / b.min() < MIN_SPAN or len(np.unique(b)) < 3:
        return None
    x, y = np.log2(b), p["accept"].to_numpy()
    start, end = _fit(x, y)
    return Trend(len(p), spearman(x, y), start, end, float(b.min()), float(b.max()))


def uptime_trend(points: pd.DataFrame) -> Trend | None:
    """Accept length regressed on minutes since the first line, up to its lowest stretch (a flush or restart after
    it would hide the fall); None without times or below ``MIN_LINES`` lines before that stretch."""
    p = points[points["time"].notna()].reset_index(drop=True)
    if len(p) < MIN_LINES:
        return None
    window = max(2, len(p) // 8)
    smooth = p["accept"].rolling(window, min_periods=window).median()
    trough = int(smooth.idxmin()) if smooth.notna().any() else len(p) - 1
    p = p.iloc[: max(trough + 1, MIN_LINES)]
    t = (p["time"] - p["time"].min()).dt.total_seconds().to_numpy() / 60.0
    if t.max() <= 0:
        return None
    y = p["accept"].to_numpy()
    start, end = _fit(t, y)
    return Trend(len(p), spearman(t, y), start, end, 0.0, float(t.max()))


def recovery(points: pd.DataFrame, trend: Trend) -> int | None:
    """The line number where accept length comes back to within 10% of the start's gain after falling (a flush or
    a restart of the cache), None when it does not."""
    y = points["accept"].to_numpy()
    if len(y) < MIN_LINES:
        return None
    window = max(2, len(y) // 8)
    smooth = pd.Series(y).rolling(window, min_periods=window).median().to_numpy()
    floor = trend.start - 0.5 * (trend.start - 1.0)
    fell = False
    for i, v in enumerate(smooth):
        if not math.isfinite(v):
            continue
        if v <= floor:
            fell = True
        elif fell and v >= trend.start - 0.1 * (trend.start - 1.0):
            return int(points["line"].iloc[i])
    return None


def cached_share(path: str | Path) -> pd.DataFrame:
    """SGLang ``Prefill batch`` lines: time, line, the cumulative share of prompt tokens served from cache."""
    rows = []
    new = cached = 0
    for number, text in read_lines(path):
        m = _PREFILL.search(text)
        if not m:
            continue
        new, cached = new + int(m.group(1)), cached + int(m.group(2))
        stamp = _STAMP.search(text)
        rows.append({"time": pd.Timestamp(stamp.group(1)) if stamp else pd.NaT, "line": number,
                     "share": cached / (new + cached) if new + cached else 0.0})
    return pd.DataFrame(rows, columns=["time", "line", "share"])


def share_rho(points: pd.DataFrame, share: pd.DataFrame) -> float:
    """Rank correlation of accept length with the cumulative cached share at each decode line (NaN without)."""
    if share.empty or len(points) < MIN_LINES:
        return math.nan
    at = np.searchsorted(share["line"].to_numpy(), points["line"].to_numpy(), side="right") - 1
    keep = at >= 0
    if keep.sum() < MIN_LINES:
        return math.nan
    return spearman(share["share"].to_numpy()[at[keep]], points["accept"].to_numpy()[keep])


def spec_off_lines(points: pd.DataFrame, explains: Any) -> pd.DataFrame:
    """The decode lines at accept length 1.00 that ``explains(running)`` attributes to a run-time switch."""
    if points.empty:
        return points
    mask = (points["accept"] <= ONE) & points["running"].map(
        lambda r: bool(explains(None if pd.isna(r) else int(r))))
    return points[mask]


_CUMULATIVE = re.compile(r"avg_spec_accept_length=([0-9.]+)")


def cumulative_lines(path: str | Path) -> list[tuple[int, float]]:
    """SGLang's ``avg_spec_accept_length=X`` lines (line, X): the average since the server started or the last
    ``set_internal_state`` (sglang 0.5.9 srt/managers/scheduler.py, 0.5.23
    srt/managers/scheduler_components/internal_state.py ``_average_accept_length``: total accepted tokens over
    total verify rounds; ``/get_server_info`` returns the same figure)."""
    out = []
    for number, text in read_lines(path):
        m = _CUMULATIVE.search(text)
        if m:
            try:
                out.append((number, float(m.group(1))))
            except ValueError:
                continue
    return out
