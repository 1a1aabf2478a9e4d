"""Judge a scanned dataset from its results lines: the summary table per slot and the outlier records.

Per-record faults (unreadable file, NaN/Inf, padding against the ids) are already in each
line. Here come the judgements that need the whole dataset, made the same way however the
lines were produced (one run, several resumed runs, any worker order):

* layout: a record whose format, slot names, hidden size or slot dtypes differ from what
  more than half of the records have;
* norm signature: per slot and statistic, a robust z-score against the dataset's median and
  MAD (scaled to a standard deviation, never below ``FLOORS`` so that a dataset of near-identical
  records does not flag noise); ``|z| > Z_MAX`` is an outlier. Needs ``MIN_RECORDS`` records;
* shared opening tokens (with a reference): a slot confidently placed at another position
  than most records' slot of the same name.
"""
from __future__ import annotations

import sys
from collections import Counter
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

Z_MAX = 8.0
MIN_RECORDS = 8
MAD_TO_SD = 1.4826
FEATURES = ("log_norm", "log_cv", "first_excess")
FLOORS = {"log_norm": 0.02, "log_cv": 0.05, "first_excess": 0.02}
HINTS = {
    ("log_norm", -1): "per-token norms smaller than the dataset's: another layer, or raw where post-norm is expected",
    ("log_norm", 1): "per-token norms larger than the dataset's: another layer, or post-norm where raw is expected",
    ("first_excess", -1): "the first token lacks the massive activation the others have: an earlier layer or the embedding",
    ("first_excess", 1): "the first token stands out more than in the other records: a later layer, or raw where post-norm is expected",
    ("log_cv", -1): "per-token norms more uniform than the dataset's: post-norm where raw is expected?",
    ("log_cv", 1): "per-token norms spread more than the dataset's: raw where post-norm is expected?",
}


def _mode(values: list[Any]) -> Any:
    counts = Counter(v for v in values if v is not None)
    return counts.most_common(1)[0][0] if counts else None


class SlotRow(NamedTuple):
    """What the judgement needs of one slot of one record (a tuple: 100k records must fit in memory)."""

    name: str
    role: str | None
    dtype: str | None
    nonfinite_rows: int
    log_norm: float | None
    norm_cv: float | None
    first_excess: float | None
    post_norm: bool | None
    resembles: str | None
    prefix_position: str | None  # only a confident placement


KEEP = ("path", "error", "format", "tokens", "padding", "hidden_size", "prefix_tokens")  # and "audit" (a row)


def _intern(text: str | None) -> str | None:
    """One copy of each repeated name ('aux_hidden_state[0]', 'bfloat16', 'p4') however many records."""
    return None if text is None else sys.intern(text)


def compact(line: dict[str, Any]) -> dict[str, Any]:
    """A results line cut to what the judgement needs (keys, shapes and the rest stay in the file)."""
    if isinstance(line.get("slots"), tuple):
        return line
    out = {k: line.get(k) for k in KEEP}
    out["format"] = _intern(out["format"])
    out["issues"] = tuple(line.get("issues") or ())
    rows = []
    for s in line.get("slots") or []:
        prefix = s.get("prefix") or {}
        rows.append(SlotRow(
            _intern(s["name"]), _intern(s.get("role")), _intern(s.get("dtype")), int(s.get("nonfinite_rows") or 0),
            s.get("log_norm"), s.get("norm_cv"), s.get("first_excess"), s.get("post_norm"),
            _intern(s.get("resembles")), _intern(prefix.get("position")) if prefix.get("confident") else None))
    out["slots"] = tuple(rows)
    audit = line.get("audit")
    if isinstance(audit, dict):
        from ..dataaudit.audit import audit_row

        out["audit"] = audit_row(audit)
    elif audit is not None:
        out["audit"] = audit
    return out


def slot_table(lines: list[dict[str, Any]]) -> "pd.DataFrame":
    """One row per (record, slot) of compacted lines: the signature, ``log_cv`` added, the reference evidence."""
    import pandas as pd

    cols = ["path", *SlotRow._fields]
    df = pd.DataFrame([(line["path"], *s) for line in lines for s in line["slots"]], columns=cols)
    df = df.rename(columns={"name": "slot"})
    cv = pd.to_numeric(df["norm_cv"], errors="coerce").astype(float)
    df.insert(cols.index("norm_cv") + 1, "log_cv", np.log(cv.where(cv > 0)))
    return df


def robust_center(values: "pd.Series", floor: float) -> tuple[float, float]:
    """(median, scale): the MAD scaled to a standard deviation, at least ``floor``."""
    med = float(values.median())
    mad = float((values - med).abs().median()) * MAD_TO_SD
    return med, max(mad, floor)


def _layout_reasons(lines: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Records whose format, slot names, hidden size or slot dtypes differ from what most (over half) records have."""
    ok = [line for line in lines if not line.get("error")]
    reasons: dict[str, list[str]] = {}
    fields = {
        "format": lambda line: line.get("format"),
        "slots": lambda line: ", ".join(s.name for s in line["slots"]),
        "hidden size": lambda line: line.get("hidden_size"),
        "dtypes": lambda line: ", ".join(f"{s.name} {s.dtype}" for s in line["slots"]),
    }
    common = {label: _majority([get(line) for line in ok]) for label, get in fields.items()}
    for line in ok:
        for label, get in fields.items():
            value = get(line)
            if common[label] is None or value == common[label]:
                continue
            if label == "dtypes" and fields["slots"](line) != common["slots"]:
                continue  # other slot names are reported once, as slots
            reasons.setdefault(line["path"], []).append(f"{label} {value} differs from most records ({common[label]})")
    return reasons


def _majority(values: list[Any]) -> Any:
    """The value more than half of ``values`` share, else None (a mixed dataset has no norm to differ from)."""
    counts = Counter(values)
    if not counts:
        return None
    value, n = counts.most_common(1)[0]
    return value if n * 2 > len(values) else None


def _signature_reasons(slots: "pd.DataFrame") -> dict[str, list[str]]:
    reasons: dict[str, list[str]] = {}
    for name, group in slots.groupby("slot", sort=False):
        for feat in FEATURES:
            values = group[feat].dropna()
            if len(values) < MIN_RECORDS:
                continue
            med, scale = robust_center(values, FLOORS[feat])
            z = (values - med) / scale
            for idx in z[z.abs() > Z_MAX].index:
                v, zz = float(values[idx]), float(z[idx])
                hint = HINTS[(feat, 1 if zz > 0 else -1)]
                reasons.setdefault(group.at[idx, "path"], []).append(
                    f"{name}: {feat} {v:.3f} vs dataset median {med:.3f} (robust z {zz:+.0f}): {hint}")
    return reasons


def _prefix_reasons(lines: list[dict[str, Any]], slots: "pd.DataFrame") -> dict[str, list[str]]:
    reasons: dict[str, list[str]] = {}
    shared = {line["path"]: line.get("prefix_tokens", 0) for line in lines}
    for name, group in slots.groupby("slot", sort=False):
        placed = group["prefix_position"].dropna()
        if placed.empty:
            continue
        common = placed.mode().iloc[0]
        for idx in placed[placed != common].index:
            path = group.at[idx, "path"]
            reasons.setdefault(path, []).append(
                f"{name} holds {placed[idx]} on the {shared.get(path, 0)} opening tokens it shares with the reference; "
                f"{(placed == common).sum()} of {len(placed)} records hold {common} there")
    return reasons


def _audit_reasons(lines: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Records the training-data audit sets apart: a shifted loss mask; answers after another skeleton than most
    records'; answers the target did not write while the dataset as a whole reads as its own."""
    from ..dataaudit import audit as da
    from ..dataaudit import templates as tpl

    rows = [(line["path"], line.get("audit")) for line in lines if isinstance(line.get("audit"), da.AuditRow)]
    if not rows:
        return {}
    summary = da.AuditSummary.of({"path": p, "audit": r} for p, r in rows)
    common = _majority([r.skeleton for _, r in rows if r.skeleton])
    dataset_ok = summary.origin_verdict != "not-from-target"  # else the dataset finding says it, not 2,000 outliers
    reasons: dict[str, list[str]] = {}
    for path, r in rows:
        starts = dict(r.starts)
        if starts.get(tpl.START_LATE) or starts.get(tpl.START_EARLY):
            where = "after" if starts.get(tpl.START_LATE, 0) >= starts.get(tpl.START_EARLY, 0) else "before the end of"
            reasons.setdefault(path, []).append(
                f"loss mask shifted: a supervised run starts one token {where} the assistant header")
        if common is not None and r.skeleton and r.skeleton != common and \
                r.skeleton.split(":")[0] != common.split(":")[0]:
            reasons.setdefault(path, []).append(f"answers follow {r.skeleton}; most records: {common}")
        if dataset_ok and r.agreement is not None:
            from ..dataaudit.agreement import Agreement

            a = Agreement(*r.agreement)
            if a.verdict == "not-from-target":
                reasons.setdefault(path, []).append(
                    f"answers not written by the target ({' and '.join(a.reasons)}): greedy agreement "
                    f"{a.agreement:.2f} (its own samples at T {a.fitted_temperature:g}: {a.expected_agreement:.2f}), "
                    f"surprise {a.mean_surprise:+.2f} nats/token (z {a.z:.1f}), PIT chi-square {a.shape_chi2:.0f}, "
                    f"over {a.tokens} tokens")
    return reasons


def find_outliers(lines: list[dict[str, Any]], slots: "pd.DataFrame") -> dict[str, list[str]]:
    """Every record with at least one reason, in dataset order, reasons in a fixed order."""
    by_rule = [_layout_reasons(lines), _signature_reasons(slots), _prefix_reasons(lines, slots), _audit_reasons(lines)]
    out: dict[str, list[str]] = {}
    for line in lines:
        path = line["path"]
        reasons = [f"unreadable: {line['error']}"] if line.get("error") else list(line.get("issues") or [])
        for rule in by_rule:
            reasons += rule.get(path, [])
        if reasons:
            out[path] = reasons
    return out


def summary_table(slots: "pd.DataFrame", outliers: dict[str, list[str]]) -> "pd.DataFrame":
    """One row per slot: how many records, dtype, median signature and spread, what it resembles or holds."""
    import pandas as pd

    rows = []
    for name, g in slots.groupby("slot", sort=False):
        row: dict[str, Any] = {"slot": name, "records": len(g), "dtype": _mode(list(g["dtype"]))}
        for feat in ("log_norm", "norm_cv", "first_excess"):
            vals = g[feat].dropna()
            row[feat] = float(vals.median()) if len(vals) else None
        lv = g["log_norm"].dropna()
        row["log_norm_mad"] = robust_center(lv, 0.0)[1] if len(lv) else None
        pn = g["post_norm"].dropna()
        row["post_norm_share"] = float(pn.astype(bool).mean()) if len(pn) else None
        row["resembles"] = _share(g["resembles"])
        row["holds_on_prefix"] = _share(g["prefix_position"])
        row["outliers"] = int(sum(any(r.startswith(f"{name}:") or r.startswith(f"{name} holds") for r in outliers.get(p, []))
                                  for p in g["path"]))
        rows.append(row)
    cols = ["slot", "records", "dtype", "log_norm", "log_norm_mad", "norm_cv", "first_excess", "post_norm_share",
            "resembles", "holds_on_prefix", "outliers"]
    return pd.DataFrame(rows, columns=cols)


def _share(values: "pd.Series") -> str | None:
    """``'p4 (1998/1999)'``: the most common value and how many records have it."""
    v = values.dropna()
    if v.empty:
        return None
    common = v.mode().iloc[0]
    return f"{common} ({int((v == common).sum())}/{len(v)})"
