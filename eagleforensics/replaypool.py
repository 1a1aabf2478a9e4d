"""Replay pooled over a capture set: every sequence replayed, acc_k and the accept length pooled over them.

``run_pooled`` replays the drafter on each capture of a capture set (``io.captureset``: what ``capture
--prompts`` writes) with ``replay.run_replay`` and adds up, per wiring, the rows each step counted and
the drafts accepted there (acc_k pooled = all hits / all counted rows, as a trainer's acc_k over many
sequences), and the chains' reach over all start rows (the accept length pooled). With ``--train`` a
directory, each capture gets the record whose token ids hold its sequence (``evidence.recordmatch``):
that record's loss mask and trained wiring; a capture that no record matches is replayed unmasked and
said so. Per sequence the table keeps its counts, so one odd sequence can be found.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ForensicsError, printable
from .results import Finding

SCHEMA = "eagleforensics-replay-pooled-v1"


@dataclass
class PooledWiring:
    """One wiring's counts added over the sequences it was replayed on."""

    label: str
    steps: int
    sources: list[str] = field(default_factory=list)
    hits: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    reach_hits: list[float] = field(default_factory=list)
    starts: int = 0
    sequences: int = 0
    trained_in: int = 0  # sequences where this was the trained wiring

    def add(self, r: Any) -> None:
        if not self.hits:
            self.hits, self.rows, self.reach_hits = [0] * self.steps, [0] * self.steps, [0.0] * self.steps
        for k in range(self.steps):
            n = r.acc_rows[k] if k < len(r.acc_rows) else 0
            self.rows[k] += n
            self.hits[k] += 0 if not n or r.acc[k] is None else int(round(r.acc[k] * n))
            self.reach_hits[k] += 0.0 if not r.starts or r.reach[k] is None else r.reach[k] * r.starts
        self.starts += r.starts
        self.sequences += 1
        for s in r.source.split("; "):
            if s and s not in self.sources:
                self.sources.append(s)

    @property
    def acc(self) -> list[float | None]:
        return [None if n == 0 else h / n for h, n in zip(self.hits, self.rows)]

    @property
    def accept_length(self) -> float | None:
        return None if self.starts == 0 else 1.0 + sum(self.reach_hits) / self.starts

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "sources": self.sources, "acc": self.acc, "hits": self.hits,
                "acc_rows": self.rows, "starts": self.starts, "accept_length": self.accept_length,
                "sequences": self.sequences, "trained_in": self.trained_in}


@dataclass
class PooledReplay:
    """Replay over a capture set: pooled figures per wiring and each sequence's own counts."""

    drafter: str
    captures: str
    steps: int
    wirings: list[PooledWiring]
    sequences: list[dict[str, Any]]
    findings: list[Finding]
    exit_code: int = 0

    @property
    def trained(self) -> PooledWiring | None:
        return max((w for w in self.wirings if w.trained_in), key=lambda w: w.trained_in, default=None)

    def to_dict(self) -> dict[str, Any]:
        t = self.trained
        return {"schema": SCHEMA, "drafter": self.drafter, "captures": self.captures, "steps": self.steps,
                "sequences": self.sequences, "trained": None if t is None else t.label,
                "wirings": [w.to_dict() for w in self.wirings], "findings": [f.to_dict() for f in self.findings],
                "exit_code": self.exit_code}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def to_text(self) -> str:
        pr = printable
        matched = sum(1 for s in self.sequences if s["record"] is not None)
        lines = [f"drafter:  {pr(self.drafter)}", f"captures: {pr(self.captures)} ({len(self.sequences)} sequences"
                 f"{f', {matched} matched to a training record by their ids' if matched else ''})",
                 f"pooled:   acc@k = drafts accepted / rows counted, over every sequence; accept len over every "
                 f"start row ({self.steps} draft steps)", ""]
        head = ["wiring", "sequences", "starts"] + [f"acc@{k}" for k in range(1, self.steps + 1)] + \
            [f"rows@{k}" for k in range(1, self.steps + 1)] + ["accept len"]
        rows = []
        for w in self.wirings:
            rows.append([pr(w.label) + ("*" if w is self.trained else ""), str(w.sequences), str(w.starts)]
                        + [_num(a) for a in w.acc] + [str(n) for n in w.rows] + [_num(w.accept_length)])
        lines += _table(head, rows)
        lines.append("(* = the trained wiring; per sequence below: rows counted and acc@1 of each wiring)")
        lines.append("")
        labels = [w.label for w in self.wirings]
        head = ["capture", "tokens", "record", "supervised"] + [f"acc@1 {pr(x)}" for x in labels]
        rows = []
        for s in self.sequences:
            per = {r["label"]: r for r in s["wirings"]}
            rows.append([pr(s["capture"]), str(s["tokens"]), pr(s["record"] or "none"),
                         "-" if s["supervised_rows"] is None else str(s["supervised_rows"])]
                        + [(f"{_num(per[x]['acc'][0])} ({per[x]['acc_rows'][0]})" if x in per else "-") for x in labels])
        lines += _table(head, rows)
        if self.findings:
            lines += ["", "findings:"] + [f"  [{f.severity}] {f.code}: {pr(f.message)}" for f in self.findings]
        return "\n".join(lines)


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]


def load_records(train: str | Path, allow_unsafe: bool, limit: int = 4096) -> list[tuple[str, Any]]:
    """(path, record) for ``train``: one record file, or every record under a directory (natural order)."""
    from .io.training import load_training
    from .scan.runner import find_records

    p = Path(train)
    if not p.is_dir():
        return [(str(p), load_training(p, allow_unsafe=allow_unsafe))]
    found = find_records(p)[:limit]
    return [(str(p / rel), load_training(str(p / rel), allow_unsafe=allow_unsafe)) for rel in found]


def run_pooled(drafter_dir: str | Path, capture_dir: str | Path, *, train: str | Path | None = None,
               steps: int = 3, allow_unsafe: bool = False, convention: str = "hf", **replay_kwargs: Any
               ) -> PooledReplay:
    """Replay the drafter on every capture of a capture set and pool the counts (see the module docstring)."""
    from .evidence.recordmatch import match_record
    from .io.capture import load_capture
    from .io.captureset import list_capture_set
    from .replay import run_replay

    files = list_capture_set(capture_dir)
    if files is None:
        raise ForensicsError("is not a capture set (a directory of capture files, as capture --prompts writes)",
                             path=capture_dir)
    records = [] if train is None else load_records(train, allow_unsafe)
    pooled: dict[str, PooledWiring] = {}
    sequences: list[dict[str, Any]] = []
    notes: dict[str, tuple[Finding, int]] = {}
    unmatched: list[str] = []
    exit_code = 0
    for f in files:
        cap = load_capture(f, convention=convention, allow_unsafe=allow_unsafe)
        rec_path, rec = None, None
        if records:
            if cap.input_ids is None:
                raise ForensicsError("holds no input_ids: it cannot be matched to a training record", path=f)
            m = match_record(cap.input_ids, [r for _, r in records])
            if m is None:
                unmatched.append(f.name)
            else:
                rec_path, rec = records[m.index]
        rep = run_replay(drafter_dir, cap, train=rec, steps=steps, allow_unsafe=allow_unsafe, convention=convention,
                         **replay_kwargs)
        exit_code = max(exit_code, rep.exit_code)
        trained = rep.trained
        for r in rep.results:
            key = r.label + (f" as served without {', '.join(r.served_without)}" if r.served_without else "")
            w = pooled.setdefault(key, PooledWiring(key, steps))
            w.add(r)
            if r is trained:
                w.trained_in += 1
        for fd in rep.findings:
            if fd.severity == "info":
                continue
            seen = notes.get(fd.code)
            notes[fd.code] = (seen[0] if seen else fd, (seen[1] if seen else 0) + 1)
        sequences.append({"capture": f.name, "tokens": rep.tokens,
                          "record": None if rec_path is None else Path(rec_path).name,
                          "supervised_rows": rep.supervised_rows,
                          "wirings": [{"label": r.label + (f" as served without {', '.join(r.served_without)}"
                                                            if r.served_without else ""),
                                       "acc": r.acc, "acc_rows": r.acc_rows, "starts": r.starts,
                                       "accept_length": r.accept_length} for r in rep.results]})
    findings = [Finding(code, fd.severity, f"{n} of {len(files)} sequences: {fd.message}")
                for code, (fd, n) in notes.items()]
    if unmatched:
        shown = ", ".join(unmatched[:5]) + (f" and {len(unmatched) - 5} more" if len(unmatched) > 5 else "")
        findings.insert(0, Finding("capture-unmatched", "warning",
                                   f"no training record under {printable(str(train))} holds the ids of {len(unmatched)}"
                                   f" of {len(files)} captures ({shown}): those were replayed without a loss mask or "
                                   "a trained wiring (every row counts)"))
    return PooledReplay(str(drafter_dir), str(capture_dir), steps, list(pooled.values()), sequences, findings,
                        exit_code)
