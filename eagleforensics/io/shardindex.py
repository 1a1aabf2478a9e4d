"""A safetensors shard index (``model.safetensors.index.json``) read for its ``weight_map`` only, nothing else built.

``json.loads`` of the whole file built every value of ``metadata`` too: 64 MiB of empty lists there took 1.9 GiB.
Here one linear numpy pass over the bytes (``guards.json_levels``) finds the top-level members; only the
``weight_map`` member is decoded, after checking that it is one flat object (no list or object inside, so no value
can be built larger than its own text) of at most ``MAX_INDEX_ENTRIES`` entries. ``metadata`` and any other member
is skipped unread: its size is bounded by the file's (``MAX_INDEX_BYTES``) and it is never kept.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import ForensicsError
from .guards import MAX_DEPTH, json_levels

WHAT = "safetensors shard index"
# Tensors an index lists: DeepSeek-V3 and Kimi-K2 in FP8 (weights and their scales) list about 140k; seven times it.
MAX_INDEX_ENTRIES = 1_000_000
MAX_MEMBERS = 10_000  # top-level keys: a real index has two (metadata, weight_map)
_WS = b" \t\r\n"


def _members(raw: bytes, path: Path) -> list[tuple[int, int, int]]:
    """(start, colon, end) of each top-level member ``"key": value`` (start after the brace or comma before it)."""
    opens: list[int] = []
    marks: list[np.ndarray] = []  # top-level commas, colons and the closing brace, in order
    deepest, lowest = 0, 0
    for at, c, outside, level in json_levels(raw):
        deepest, lowest = max(deepest, int(level.max())), min(lowest, int(level.min()))
        if deepest > MAX_DEPTH:
            raise ForensicsError(f"{WHAT} is nested more than {MAX_DEPTH} levels deep: corrupt or hostile", path=path)
        top = outside & (level == 1)
        if not opens:
            first = np.flatnonzero(top & (c == 0x7B))[:1]
            opens += [at + int(i) for i in first]
        hit = (top & ((c == 0x2C) | (c == 0x3A))) | (outside & (level == 0) & (c == 0x7D))
        marks.append(np.flatnonzero(hit) + at)
        if sum(m.size for m in marks) > 2 * MAX_MEMBERS + 1:
            raise ForensicsError(f"{WHAT} has more than {MAX_MEMBERS:,} top-level keys: not a shard index", path=path)
    body = raw.strip(_WS)
    if not body.startswith(b"{"):
        if body[:1] in (b"[", b'"') or body[:1].isdigit() or body[:4] in (b"true", b"null") or body[:5] == b"false":
            raise ForensicsError(f"{WHAT} is not a JSON object", path=path)
        raise ForensicsError(f"{WHAT} is not valid JSON (it does not start with an object)", path=path)
    if lowest < 0 or not opens or not body.endswith(b"}"):
        raise ForensicsError(f"{WHAT} is not valid JSON (unbalanced brackets): truncated or corrupt", path=path)
    points = np.concatenate(marks).tolist() if marks else []
    if not points or raw[points[-1]] != 0x7D or points[-1] != len(raw.rstrip(_WS)) - 1:
        raise ForensicsError(f"{WHAT} is not valid JSON (text after the object): corrupt", path=path)
    if sum(raw[p] == 0x7D for p in points) != 1:
        raise ForensicsError(f"{WHAT} is not valid JSON (more than one top-level value): corrupt", path=path)
    out, start, colon = [], opens[0], None
    for p in points:
        if raw[p] == 0x3A and colon is None:
            colon = p
        elif raw[p] != 0x3A:
            if colon is None:
                if raw[start + 1:p].strip(_WS) or raw[p] == 0x2C:
                    raise ForensicsError(f"{WHAT} is not valid JSON (a key without a value): corrupt", path=path)
            else:
                out.append((start, colon, p))
            start, colon = p, None
    return out


def _json(text: bytes, path: Path) -> object:
    try:
        return json.loads(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise ForensicsError(f"{WHAT} is not UTF-8 text: corrupt", path=path) from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more digits than int() converts
        raise ForensicsError(f"{WHAT} is not valid JSON ({' '.join(str(exc).split())[:120]})", path=path) from None


def weight_map_of(raw: bytes, path: Path) -> dict:
    """The ``weight_map`` object of an index's bytes (the last one, as ``json.loads`` keeps), checked flat and bounded;
    every other member skipped. Bad input is one ForensicsError naming ``path``."""
    span = None
    for start, colon, end in _members(raw, path):
        key = _json(raw[start + 1:colon].strip(_WS), path)
        if not isinstance(key, str):
            raise ForensicsError(f"{WHAT} is not valid JSON (a key that is not a string): corrupt", path=path)
        if key == "weight_map":
            span = (colon + 1, end)
    if span is None:
        raise ForensicsError("shard index has no weight_map object", path=path)
    text = raw[span[0]:span[1]].strip(_WS)
    if not (text.startswith(b"{") and text.endswith(b"}")):
        raise ForensicsError("shard index has no weight_map object", path=path)
    entries = 0
    for _, c, outside, level in json_levels(text):
        if int(level.max()) > 1:
            raise ForensicsError("weight_map holds a list or an object where shard file names belong", path=path)
        entries += int(np.count_nonzero(outside & (c == 0x3A)))
    if entries > MAX_INDEX_ENTRIES:
        raise ForensicsError(f"weight_map lists {entries:,} tensors, past the cap of {MAX_INDEX_ENTRIES:,} (the "
                             "largest published checkpoints list about 140,000)", path=path)
    wmap = _json(text, path)
    if not isinstance(wmap, dict):  # pragma: no cover - the brackets were checked above
        raise ForensicsError("shard index has no weight_map object", path=path)
    return wmap
