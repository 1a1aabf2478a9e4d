"""Which training record holds the captured sequence: records matched to a capture by their token ids.

A record and a capture are of the same sequence when one's ids (the record's trailing padding dropped)
are a prefix of the other's: a capture of the served prompt is a prefix of the record of prompt + answer,
a capture made from the record's ids equals them. Records that share only an opening (a system prompt)
and then differ are not the sequence, however long that opening is. Among matches the longest shared
run wins (the first such record in the given order on a tie).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..arrays import as_array
from .tokens import common_prefix, trailing_padding


@dataclass(frozen=True)
class RecordMatch:
    """The record (its index in the list given) whose ids hold the capture's sequence, and how many ids agree."""

    index: int
    shared: int  # ids the two agree on from the first (the shorter one's length)
    record_tokens: int
    capture_tokens: int


def record_ids(rec: Any) -> np.ndarray | None:
    """A training record's ids without its trailing padding, or None when it holds no ids."""
    if getattr(rec, "input_ids", None) is None:
        return None
    ids = as_array(rec.input_ids).reshape(-1)
    return ids[:ids.shape[0] - trailing_padding(ids, rec.loss_mask)]


def same_sequence(ids: Any, capture_ids: Any) -> int:
    """How many ids the two share when one is a prefix of the other (the same sequence), else 0."""
    a, b = as_array(ids).reshape(-1), as_array(capture_ids).reshape(-1)
    if a.shape[0] == 0 or b.shape[0] == 0:
        return 0
    shared = common_prefix(a, b)
    return shared if shared == min(a.shape[0], b.shape[0]) else 0  # they part somewhere: another sequence


def match_record(capture_ids: Any, records: Sequence[Any]) -> RecordMatch | None:
    """The record whose ids hold the capture's sequence (see the module docstring), or None when none does."""
    cap = as_array(capture_ids).reshape(-1)
    best: RecordMatch | None = None
    for i, rec in enumerate(records):
        ids = record_ids(rec)
        if ids is None:
            continue
        shared = same_sequence(ids, cap)
        if not shared:
            continue
        if best is None or shared > best.shared:
            best = RecordMatch(i, shared, int(ids.shape[0]), int(cap.shape[0]))
    return best


def closest_record(capture_ids: Any, records: Sequence[Any]) -> RecordMatch:
    """The record sharing the longest opening with the capture (the first on a tie; index 0 when none has ids)."""
    cap = as_array(capture_ids).reshape(-1)
    best = RecordMatch(0, 0, 0, int(cap.shape[0]))
    for i, rec in enumerate(records):
        ids = record_ids(rec)
        if ids is not None and (shared := common_prefix(ids, cap)) > best.shared:
            best = RecordMatch(i, shared, int(ids.shape[0]), int(cap.shape[0]))
    return best
