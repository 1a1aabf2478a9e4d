"""Mutated copies of the real sample files, for the property tests and ``scripts/fuzz.py``.

A case is (training sample, capture sample, which side is mutated, a list of byte edits).
The edits are the ways real files go bad: a flipped bit, a byte overwritten with a boundary
value, a file cut short, bytes dropped or inserted, a gzip member corrupted after
compression. ``run_case`` writes the mutated file into a scratch folder (never next to the
samples), runs the loaders and ``align`` on it and says how it ended.
"""
from __future__ import annotations

import gzip
import io
import zipfile
import traceback
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data_samples"
# training samples and what they are called on disk; ".ckpt.gz" is made from data_0.ckpt
TRAIN = ("record_layer_outputs.pt", "record_wrong_fix.pt", "data_0.ckpt", "data_0.ckpt.gz")
CAPTURE = ("capture.pt", "capture_sweep.safetensors")
INTERESTING = (0x00, 0x01, 0x7F, 0x80, 0xFF, 0x3C, 0x7B, 0x22, 0x30)  # bounds, '<', '{', '"', '0'


@lru_cache(maxsize=None)
def sample_bytes(name: str) -> bytes:
    """The bytes of a sample (``data_0.ckpt.gz`` is data_0.ckpt gzipped, deterministically)."""
    if name.endswith(".gz"):
        return gzip.compress((SAMPLES / name[:-3]).read_bytes(), mtime=0)
    return (SAMPLES / name).read_bytes()


def sample_path(name: str, scratch: Path) -> Path:
    """A readable path to an unmutated sample (gz variants are written into ``scratch``)."""
    if not name.endswith(".gz"):
        return SAMPLES / name
    p = scratch / f"clean_{name}"
    if not p.exists():
        p.write_bytes(sample_bytes(name))
    return p


@dataclass(frozen=True)
class Edit:
    """One byte edit: ``op`` in flip/set/truncate/delete/insert; ``pos`` is a fraction of the length."""

    op: str
    pos: float
    value: int = 0
    count: int = 1

    def apply(self, data: bytes) -> bytes:
        if not data:
            return data
        i = min(len(data) - 1, int(self.pos * len(data)))
        if self.op == "flip":
            return data[:i] + bytes([data[i] ^ (self.value or 1)]) + data[i + 1:]
        if self.op == "set":
            return data[:i] + bytes([self.value]) * self.count + data[i + self.count:]
        if self.op == "truncate":
            return data[:i]
        if self.op == "delete":
            return data[:i] + data[i + self.count:]
        if self.op == "insert":
            return data[:i] + bytes([self.value]) * self.count + data[i:]
        raise ValueError(self.op)


def apply_edits(data: bytes, edits: list[Edit]) -> bytes:
    for e in edits:
        data = e.apply(data)
    return data


# positions: anywhere, the first 2 KiB (headers, pickles), or the last 2 KiB (zip directory)
_ANYWHERE = st.floats(0, 1, exclude_max=True)


def _pos(size: int) -> st.SearchStrategy[float]:
    head = min(1.0, 2048 / size)
    return st.one_of(_ANYWHERE, st.floats(0, head, exclude_max=True),
                     st.floats(max(0.0, 1 - head), 1, exclude_max=True))


def edits(size: int, max_edits: int = 3) -> st.SearchStrategy[list[Edit]]:
    """A short list of byte edits for a file of ``size`` bytes."""
    byte = st.one_of(st.sampled_from(INTERESTING), st.integers(0, 255))
    flip = st.builds(Edit, st.just("flip"), _pos(size), st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 255]))
    one = st.one_of(
        flip, flip, flip,  # flips keep the structure, so they reach the tensor data and the matcher
        st.builds(Edit, st.just("set"), _pos(size), byte, st.integers(1, 8)),
        st.builds(Edit, st.just("truncate"), _pos(size)),
        st.builds(Edit, st.just("delete"), _pos(size), st.just(0), st.integers(1, 64)),
        st.builds(Edit, st.just("insert"), _pos(size), byte, st.integers(1, 64)),
    )
    return st.lists(one, min_size=1, max_size=max_edits)


def _inner(name: str) -> bytes:
    """The bytes under any gzip layer."""
    data = sample_bytes(name)
    return gzip.decompress(data) if name.endswith(".gz") else data


def _pickle_member(data: bytes) -> str | None:
    """The name of the pickle inside a torch zip archive, or None if ``data`` is not one."""
    if data[:4] != b"PK\x03\x04":
        return None
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return next((n for n in zf.namelist() if n.endswith("data.pkl")), None)


def _edit_member(data: bytes, member: str, edits: list[Edit]) -> bytes:
    """Re-zip a torch archive with one member edited (torch does not check CRCs; names must stay)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            body = zin.read(info.filename)
            zout.writestr(info.filename, apply_edits(body, edits) if info.filename == member else body)
    return out.getvalue()


def layers(name: str) -> tuple[str, ...]:
    """Where a sample can be edited: its raw bytes, the file under its gzip layer, its pickle."""
    out = ["raw"]
    if name.endswith(".gz"):
        out.append("inner")
    if _pickle_member(_inner(name)):
        out.append("pickle")
    return tuple(out)


def layer_size(name: str, layer: str) -> int:
    if layer == "raw":
        return len(sample_bytes(name))
    inner = _inner(name)
    if layer == "inner":
        return len(inner)
    with zipfile.ZipFile(io.BytesIO(inner)) as zf:
        return zf.getinfo(_pickle_member(inner) or "").file_size


@dataclass(frozen=True)
class Case:
    """Which pair is aligned, which side is mutated, at which layer, and how."""

    train: str
    capture: str
    side: str  # "train" or "capture"
    edits: tuple[Edit, ...]
    layer: str = "raw"  # "raw" bytes, "inner" (under gzip), "pickle" (the torch archive's data.pkl)

    @property
    def target(self) -> str:
        return self.train if self.side == "train" else self.capture

    def mutated(self) -> bytes:
        if self.layer == "raw":
            return apply_edits(sample_bytes(self.target), list(self.edits))
        inner = _inner(self.target)
        if self.layer == "pickle":
            inner = _edit_member(inner, _pickle_member(inner) or "", list(self.edits))
        else:
            inner = apply_edits(inner, list(self.edits))
        return gzip.compress(inner, mtime=0) if self.target.endswith(".gz") else inner


@st.composite
def cases(draw: Any, max_edits: int = 3, sides: tuple[str, ...] = ("train", "capture"),
          flips_only: bool = False) -> Case:
    """A pair, a side and edits; ``flips_only`` keeps to single bit flips in the raw bytes."""
    train = draw(st.sampled_from(TRAIN))
    capture = draw(st.sampled_from(CAPTURE))
    side = draw(st.sampled_from(sides))
    target = train if side == "train" else capture
    if flips_only:
        size = len(sample_bytes(target))
        flip = st.builds(Edit, st.just("flip"), _pos(size), st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]))
        return Case(train, capture, side, (draw(flip),))
    layer = draw(st.sampled_from(layers(target)))
    return Case(train, capture, side, tuple(draw(edits(layer_size(target, layer), max_edits))), layer)


@dataclass
class Outcome:
    """How one case ended: ``kind`` is result, clean-error or failure."""

    kind: str
    detail: str
    result: Any = None
    record: Any = None
    signature: str = ""


def write_case(case: Case, scratch: Path) -> tuple[Path, Path]:
    """Write the mutated file into ``scratch``; return (training path, capture path)."""
    scratch.mkdir(parents=True, exist_ok=True)
    mutated = scratch / f"mutated_{case.target}"
    mutated.write_bytes(case.mutated())
    train = mutated if case.side == "train" else sample_path(case.train, scratch)
    capture = mutated if case.side == "capture" else sample_path(case.capture, scratch)
    return train, capture


def run_case(case: Case, scratch: Path) -> Outcome:
    """Load both sides and align; a ForensicsError is a clean end, anything else a failure."""
    from eagleforensics.alignment import align
    from eagleforensics.io.capture import load_capture
    from eagleforensics.errors import ForensicsError
    from eagleforensics.io.training import load_training

    train, capture = write_case(case, scratch)
    try:
        record = load_training(train)
        cap = load_capture(capture)
        result = align(record, cap)
        _ = result.to_json(), result.to_text()
    except ForensicsError as exc:
        text = str(exc)
        if "\n" in text:
            return Outcome("failure", f"multi-line ForensicsError: {text!r}", signature="multi-line message")
        return Outcome("clean-error", text)
    except Exception as exc:  # noqa: BLE001 - the point is to catch anything that is not clean
        tb = traceback.extract_tb(exc.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb)
                      if "eagleforensics" in f.filename), "?")
        return Outcome("failure", f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
                       signature=f"{type(exc).__name__} at {where}")
    return Outcome("result", result.verdict, result=result, record=record)


@lru_cache(maxsize=None)
def baseline(train: str, capture: str, scratch: str) -> Any:
    """The clean alignment of a pair (what the mutated runs are judged against)."""
    from eagleforensics.alignment import align

    s = Path(scratch)
    s.mkdir(parents=True, exist_ok=True)
    return align(sample_path(train, s), sample_path(capture, s))


def relabelled(mutated: Any, clean: Any) -> bool:
    """True when the mutated capture is a valid sweep of another shape (other N or positions).

    A pickle edit can drop whole entries of an HF hidden_states list; what is left is a
    consistent sweep of a shallower model, and nothing in the file can tell the difference.
    Placements are then judged under the file's own labelling, not the clean one.
    """
    return mutated.num_layers != clean.num_layers or mutated.columns != clean.columns


def wrong_placements(mutated: Any, clean: Any) -> list[str]:
    """Slots placed confidently at a position the clean run does not give them.

    When the record lost whole entries (a pickle edit dropped an item of a list record: 3 slots where
    the clean record has 4), the names after the gap shift, so a slot is judged by content alone: it
    must hold a position some clean slot holds (found by the fuzz: [p3, p7, p12n] of a 4-entry record
    whose p10 was cut out, each placed right, read as 'hidden_states[2] is p10')."""
    if len(mutated.matches) != len(clean.matches):
        held = {m.position for m in clean.matches if m.position is not None}
        return [f"{m.name}: {m.position.label} (clean record holds {sorted(q.label for q in held)})"
                for m in mutated.matches if m.confident and m.position not in held]
    truth = {m.name: m.position for m in clean.matches}
    return [f"{m.name}: {m.position.label} (clean: {truth[m.name].label if truth.get(m.name) else 'unplaced'})"
            for m in mutated.matches
            if m.confident and m.name in truth and m.position != truth[m.name]]
