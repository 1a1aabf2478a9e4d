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


def _members(raw: bytes, path: Path) -> list[tuple[int, int, int, int, int]]:
    """(start, colon, end, deepest, entries) of each top-level member ``"key": value``: start is the brace or comma
    before it; ``deepest`` is the deepest nesting inside its value and ``entries`` the colons one level into it
    (a flat object's key count), both measured in the same one pass."""
    opens: list[int] = []
    points: list[tuple[int, int, int]] = []  # (top-level comma, colon or closing brace, deepest and colons before it)
    deep = colons = 0  # since the last point
    lowest = 0
    for at, c, outside, level in json_levels(raw):
        if int(level.max()) > MAX_DEPTH:
            raise ForensicsError(f"{WHAT} is nested more than {MAX_DEPTH} levels deep: corrupt or hostile", path=path)
        lowest = min(lowest, int(level.min()))
        top = outside & (level == 1)
        if not opens:
            opens += [at + int(i) for i in np.flatnonzero(top & (c == 0x7B))[:1]]
        hit = np.flatnonzero((top & ((c == 0x2C) | (c == 0x3A))) | (outside & (level == 0) & (c == 0x7D)))
        if len(points) + hit.size > 2 * MAX_MEMBERS + 1:
            raise ForensicsError(f"{WHAT} has more than {MAX_MEMBERS:,} top-level keys: not a shard index", path=path)
        inner = outside & (level == 2) & (c == 0x3A)
        a = 0
        for b in [*hit.tolist(), c.size]:
            if b > a:
                deep, colons = max(deep, int(level[a:b].max())), colons + int(np.count_nonzero(inner[a:b]))
            if b < c.size:
                points.append((at + b, deep, colons))
                deep = colons = 0
            a = b + 1
    body = raw.strip(_WS)
    if not body.startswith(b"{"):
        if body[:1] in (b"[", b'"') or body[:1].isdigit() or body[:4] in (b"true", b"null") or body[:5] == b"false":
            raise ForensicsError(f"{WHAT} is not a JSON object", path=path)
        raise ForensicsError(f"{WHAT} is not valid JSON (it does not start with an object)", path=path)
    if lowest < 0 or not opens or not body.endswith(b"}"):
        raise ForensicsError(f"{WHAT} is not valid JSON (unbalanced brackets): truncated or corrupt", path=path)
    if not points or raw[points[-1][0]] != 0x7D or points[-1][0] != len(raw.rstrip(_WS)) - 1:
        raise ForensicsError(f"{WHAT} is not valid JSON (text after the object): corrupt", path=path)
    if sum(raw[p] == 0x7D for p, _, _ in points) != 1:
        raise ForensicsError(f"{WHAT} is not valid JSON (more than one top-level value): corrupt", path=path)
    out, start, colon = [], opens[0], None
    for p, deepest, entries in points:
        if raw[p] == 0x3A and colon is None:
            colon = p
        elif raw[p] != 0x3A:
            if colon is None:
                if raw[start + 1:p].strip(_WS) or raw[p] == 0x2C:
                    raise ForensicsError(f"{WHAT} is not valid JSON (a key without a value): corrupt", path=path)
            else:
                out.append((start, colon, p, deepest, entries))
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
    found = None
    for start, colon, end, deepest, entries in _members(raw, path):
        key = _json(raw[start + 1:colon].strip(_WS), path)
        if not isinstance(key, str):
            raise ForensicsError(f"{WHAT} is not valid JSON (a key that is not a string): corrupt", path=path)
        if key == "weight_map":
            found = (colon + 1, end, deepest, entries)
    if found is None:
        raise ForensicsError("shard index has no weight_map object", path=path)
    text = raw[found[0]:found[1]].strip(_WS)
    if not (text.startswith(b"{") and text.endswith(b"}")):
        raise ForensicsError("shard index has no weight_map object", path=path)
    if found[2] > 2:  # the weight_map's own braces are level 2: anything deeper is a list or object inside it
        raise ForensicsError("weight_map holds a list or an object where shard file names belong", path=path)
    if found[3] > MAX_INDEX_ENTRIES:
        raise ForensicsError(f"weight_map lists {found[3]:,} tensors, past the cap of {MAX_INDEX_ENTRIES:,} (the "
                             "largest published checkpoints list about 140,000)", path=path)
    wmap = _json(text, path)
    if not isinstance(wmap, dict):  # pragma: no cover - the brackets were checked above
        raise ForensicsError("shard index has no weight_map object", path=path)
    return wmap
