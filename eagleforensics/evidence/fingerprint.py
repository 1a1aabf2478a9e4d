"""Capture fingerprints: a small JSON summary of a sweep that ``align`` accepts in place of the sweep.

A user fingerprints on the GPU box where the 2 GB sweep lives and aligns anywhere with a file
of a few percent of its size. Per position it stores:

* per-token L2 norms (float32, exact) and summary statistics (mean, std, min, max, NaN/Inf
  rows, norm mean and coefficient of variation, the largest activations);
* the first values of a few tokens and a SHA-256 of the position's stored bytes, so a
  fingerprint can be checked against its sweep and read by eye;
* a seeded random-projection sketch of every token: ``R^T x / |x|`` with a k x H matrix of
  +-1/sqrt(k) entries (Johnson-Lindenstrauss), stored as float16. Cosines between sketches
  estimate cosines between tokens (``fpmatch``);
* the full rows of a few evenly spaced "probe" tokens, in the stored dtype, from which a
  post-norm gain can be fitted (the sketches cannot: a per-dimension gain does not commute
  with a projection).

Why JSON: one self-describing file that opens anywhere, whose header (positions, shapes,
hashes, statistics) reads in any viewer, with numeric arrays as base64 so it stays compact;
parquet would add pyarrow for a single record of mostly opaque arrays.
The projection is generated from a counter-based hash (splitmix64), not a library RNG, so a
fingerprint written with one numpy/torch version is read identically with any other.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..arrays import BF16, as_array, dtype_name, f32
from ..errors import ForensicsError
from ..io.atomic import write_bytes_atomic
from ..io.capture import SweepHeader
from ..io.guards import open_regular, parse_json
from ..io.safeload import gunzip
from ..io.sizecheck import MAX_KEY_NUMBER, check_shape, claimed_int
from ..positions import Position

FORMAT = "eagleforensics-fingerprint-v1"
SKETCH_DIM = 64
PROBES = 16
FIRST_VALUES = 8
CHUNK_ROWS = 256
_MASK = (1 << 64) - 1
MAX_SKETCH = 4096  # sketch width a fingerprint may claim (written with SKETCH_DIM = 64)
MAX_PROJECTION = 1 << 25  # H x k values of the projection (128 MiB as float32): H = 16384 with k up to 2048
_PROJECTION_ROWS = 4096  # rows of the projection generated at a time (bounded temporaries)


def projection(hidden: int, k: int = SKETCH_DIM, seed: int = 0) -> np.ndarray:
    """The [H, k] float32 sketch matrix: entries +-1/sqrt(k), sign from splitmix64(seed, h*k + j); same everywhere.

    Generated ``_PROJECTION_ROWS`` rows at a time, so the uint64 temporaries stay small
    whatever H is: the result (4 H k bytes) is the only allocation that grows with H.
    """
    out = np.empty((hidden, k), dtype=np.float32)
    offset = np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK)
    scale = np.float32(1 / np.sqrt(np.float32(k)))
    for row in range(0, hidden, _PROJECTION_ROWS):
        rows = min(_PROJECTION_ROWS, hidden - row)
        with np.errstate(over="ignore"):
            z = np.arange(row * k, (row + rows) * k, dtype=np.uint64) + offset
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
        out[row:row + rows] = np.where((z >> np.uint64(63)) == 1, scale, -scale).reshape(rows, k)
    return out


def projection_digest(r: Any) -> str:
    return hashlib.sha256(np.ascontiguousarray(as_array(r))).hexdigest()[:16]  # the buffer itself, no bytes copy


def _bytes(a: np.ndarray) -> np.ndarray:
    """The stored bytes of a C-contiguous array as uint8 (bf16 included, whose dtype no buffer can carry)."""
    return a.reshape(-1).view(np.uint8)


def _encode(t: Any) -> dict[str, Any]:
    a = np.ascontiguousarray(as_array(t))
    return {"dtype": dtype_name(a.dtype), "shape": list(a.shape),
            "base64": base64.b64encode(_bytes(a).tobytes()).decode("ascii")}


_DTYPES = {"float16": np.dtype(np.float16), "bfloat16": BF16, "float32": np.dtype(np.float32),
           "float64": np.dtype(np.float64), "int64": np.dtype(np.int64)}


def _decode(d: dict[str, Any], path: str) -> np.ndarray:
    """A writable ndarray from its ``_encode`` form (little-endian bytes, as torch and numpy write them here)."""
    try:
        dtype = _DTYPES[d["dtype"]]
        raw = base64.b64decode(d["base64"], validate=True)
        shape = check_shape(d["shape"], "fingerprint array", path)  # whole numbers; an empty one claims little
        if math.prod(shape) * dtype.itemsize != len(raw):  # the bytes bound the shape: nothing sized by the claim
            raise ValueError(f"shape {shape} {d['dtype']} needs {math.prod(shape) * dtype.itemsize} bytes, "
                             f"holds {len(raw)}")
        return np.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)
    except (KeyError, TypeError, ValueError) as exc:
        raise ForensicsError(f"corrupt fingerprint array ({exc})", path=path) from None


@dataclass
class Fingerprint(SweepHeader):
    """A loaded fingerprint: the capture's header plus per-position norms, sketches and probe rows (all ndarrays)."""

    k: int
    seed: int
    probe_tokens: list[int]
    norms: dict[Position, np.ndarray]  # [T] float32
    sketches: dict[Position, np.ndarray]  # [T, k] float16, unit-norm rows
    probes: dict[Position, np.ndarray]  # [n_probes, H] stored dtype
    stats: dict[Position, dict[str, Any]] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def positions(self) -> list[Position]:
        return sorted(self.norms)

    @property
    def readers(self) -> dict[Position, Any]:
        return {}  # no tensors: plots that re-read the capture show nothing for a fingerprint


def _widen(rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``rows`` as float32 in the reused buffer ``out`` (a fresh copy per chunk would page-fault every time)."""
    x = out[: len(rows)]
    if rows.dtype == BF16:  # bf16 is the top half of a float32
        np.left_shift(rows.view(np.uint16), 16, out=x.view(np.uint32), dtype=np.uint32)
    else:
        np.copyto(x, rows, casting="unsafe")
    return x


def _norms_and_sketch(x: np.ndarray, r: np.ndarray, dev: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-row L2 norms (float32) and sketches ``x R / |x|`` (float32, NaN rows where the norm is not finite).

    On CPU in numpy; with a CUDA device the norms and the product run there (torch is imported only then).
    """
    if dev is None:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            n = np.sqrt(np.einsum("th,th->t", x, x))
            sk = (x @ r) / np.maximum(n, np.float32(1e-30))[:, None]
    else:
        import torch

        xt, rt = torch.from_numpy(x).to(dev), torch.from_numpy(r).to(dev)
        nt = torch.linalg.vector_norm(xt, dim=-1)
        n, sk = nt.cpu().numpy(), ((xt @ rt) / nt.clamp_min(1e-30).unsqueeze(-1)).cpu().numpy()
    return n, np.where(np.isfinite(n)[:, None], sk, np.float32(np.nan))


def _top_rows(mags: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` largest values, largest first, the earlier row first on ties (as torch.topk picked them)."""
    order = np.lexsort((np.arange(len(mags)), -mags))
    return order[:n]


def _position_summary(cap: Any, pos: Position, r: np.ndarray, probes: set[int], dev: Any) -> dict[str, Any]:
    """Stream one position in row chunks: norms, sketch, probe rows, statistics, hash."""
    t, h = cap.num_tokens, cap.hidden_size
    digest = hashlib.sha256()
    norms = np.empty(t, dtype=np.float32)
    sketch = np.empty((t, r.shape[1]), dtype=np.float16)
    total = total_sq = 0.0
    lo, hi, count, bad = float("inf"), float("-inf"), 0, 0
    top: list[tuple[float, int, int]] = []
    first: dict[str, list[float]] = {}
    probe_rows: list[np.ndarray] = []
    stored = _DTYPES.get(dtype_name(cap.dtype), BF16)
    scratch = np.empty((min(t, CHUNK_ROWS), h), dtype=np.float32)
    for a in range(0, t, CHUNK_ROWS):
        rows = np.ascontiguousarray(as_array(cap.read_rows(pos, a, min(t, a + CHUNK_ROWS))))
        stored = rows.dtype
        digest.update(_bytes(rows))
        x = _widen(rows, scratch)
        n, sk = _norms_and_sketch(x, r, dev)
        ok = np.isfinite(n)
        norms[a:a + len(rows)] = n
        sketch[a:a + len(rows)] = sk.astype(np.float16)
        nbad = int((~ok).sum())
        good = x if nbad == 0 else x[ok]
        bad += nbad
        if good.size:
            total += float(good.sum())
            total_sq += float(np.square(n[ok].astype(np.float64)).sum())  # sum of squares = sum of squared row norms
            lo, hi, count = min(lo, float(good.min())), max(hi, float(good.max())), count + good.size
            mags = np.nan_to_num(np.abs(x).max(-1), nan=0.0)
            for i in _top_rows(mags, min(3, len(rows))).tolist():
                top.append((float(mags[i]), a + i, int(np.nan_to_num(np.abs(x[i]), nan=0.0).argmax())))
        for i in sorted({0, 1, t - 1} & set(range(a, a + len(rows)))):
            first[str(i)] = [float(v) for v in x[i - a, :FIRST_VALUES].tolist()]
        for i in sorted(q for q in probes if a <= q < a + len(rows)):
            probe_rows.append(rows[i - a].copy())
    finite = norms[np.isfinite(norms)].astype(np.float64)
    mean = total / count if count else float("nan")
    top = sorted(top, reverse=True)[:3]
    stats = {
        "mean": mean, "std": (max(total_sq / count - mean * mean, 0.0) ** 0.5) if count else float("nan"),
        "min": lo if count else None, "max": hi if count else None, "nonfinite_rows": bad,
        "norm_mean": float(finite.mean()) if finite.size else None,
        "norm_cv": float(finite.std(ddof=1) / finite.mean()) if finite.size > 1 and float(finite.mean()) > 0 else None,
        "largest": [{"value": v, "token": tk, "dim": d} for v, tk, d in top],
    }
    return {
        "p": pos.p, "normed": pos.normed, "label": pos.label, "dtype": dtype_name(stored),
        "sha256": digest.hexdigest(), "stats": _finite(stats), "first_values": _finite(first),
        "norms": _encode(norms), "sketch": _encode(sketch),
        "probe_rows": _encode(np.stack(probe_rows) if probe_rows else np.zeros((0, h), dtype=stored)),
    }


def _finite(obj: Any) -> Any:
    """NaN/Inf as None, so the JSON is standard (other readers reject NaN literals)."""
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def probe_tokens(t: int, n: int = PROBES) -> list[int]:
    """``n`` evenly spaced token rows (first and last included), or all when fewer."""
    if t <= n:
        return list(range(t))
    return sorted({round(i * (t - 1) / (n - 1)) for i in range(n)})


def _device(device: str) -> Any:
    """None for the numpy path (CPU), else the torch CUDA device; torch is imported only for a GPU."""
    if device == "cpu":
        return None
    from .match import resolve_device

    dev = resolve_device(device)
    if dev == "cpu":
        return None
    import torch

    return torch.device(dev)


def make_fingerprint(cap: Any, *, k: int = SKETCH_DIM, seed: int = 0, probes: int = PROBES, device: str = "cpu",
                     progress: Callable[[Position], None] | None = None) -> dict[str, Any]:
    """The fingerprint of a loaded capture as a JSON-ready dict (one position in memory at a time).

    The capture's rows may be torch tensors or ndarrays; the arithmetic is numpy unless ``device`` is a GPU.
    """
    if k < 8:
        raise ForensicsError(f"sketch dimension k={k} is too small to estimate cosines (use 32 or more)")
    dev = _device(device)
    r = projection(cap.hidden_size, k, seed)
    picks = probe_tokens(cap.num_tokens, probes)
    entries = []
    for pos in cap.positions:
        entries.append(_position_summary(cap, pos, r, set(picks), dev))
        if progress is not None:
            progress(pos)
    return {
        "format": FORMAT,
        "source": {"path": str(cap.path), "convention": cap.convention},
        "num_layers": cap.num_layers, "num_layers_source": cap.num_layers_source,
        "hidden_size": cap.hidden_size, "num_tokens": cap.num_tokens,
        "dtype": dtype_name(cap.dtype),
        "sketch": {"k": k, "seed": seed, "kind": "rademacher-splitmix64", "normalized": True,
                   "projection_sha256": projection_digest(r)},
        "probe_tokens": picks,
        "input_ids": None if cap.input_ids is None else [int(i) for i in as_array(cap.input_ids).tolist()],
        "positions": entries,
    }


def write_fingerprint(doc: dict[str, Any], path: str | Path) -> Path:
    """Write a fingerprint (``.gz`` names are gzip-compressed); the format key comes first for sniffing."""
    p = Path(path)
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    if p.name.endswith(".gz"):
        text = gzip.compress(text, compresslevel=6, mtime=0)
    return write_bytes_atomic(p, text)  # all or nothing: a full disk leaves the previous file as it was


def _head(path: Path, n: int = 64) -> bytes:
    with open_regular(path, "file") as raw:
        head = raw.read(n)
        if head[:2] == b"\x1f\x8b":
            raw.seek(0)
            try:
                with gzip.GzipFile(fileobj=raw, mode="rb") as fh:
                    head = fh.read(n)
            except (OSError, EOFError, zlib.error):
                return b""
    return head


def is_fingerprint(path: str | Path) -> bool:
    """True when the file's first bytes are a fingerprint's JSON header (plain or gzip)."""
    p = Path(path)
    return p.is_file() and FORMAT.encode() in _head(p)


def load_fingerprint(path: str | Path) -> Fingerprint:
    """Read a fingerprint file written by ``write_fingerprint``: numpy arrays throughout, torch never imported."""
    p = Path(path)
    try:
        with open_regular(p, "fingerprint file") as fh:
            raw = fh.read()
        doc = parse_json(gunzip(p) if raw[:2] == b"\x1f\x8b" else raw, p, "fingerprint")
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ForensicsError(f"cannot read the fingerprint ({exc})", path=p) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ForensicsError(f"not a fingerprint of format {FORMAT}", path=p)
    try:
        sk = doc["sketch"]
        k, seed = claimed_int(sk["k"], "sketch k", p, lo=1, hi=MAX_SKETCH), claimed_int(sk["seed"], "sketch seed", p)
        h = claimed_int(doc["hidden_size"], "hidden_size", p, lo=1)
        t = claimed_int(doc["num_tokens"], "num_tokens", p, lo=1)
        norms, sketches, probes, stats = {}, {}, {}, {}
        for e in doc["positions"]:
            pos = Position(claimed_int(e["p"], "position", p, hi=MAX_KEY_NUMBER), bool(e["normed"]))
            norms[pos] = f32(_decode(e["norms"], str(p)))
            sketches[pos] = _decode(e["sketch"], str(p))
            probes[pos] = _decode(e["probe_rows"], str(p))
            stats[pos] = dict(e.get("stats") or {}) | {"sha256": e.get("sha256"), "first_values": e.get("first_values")}
            if norms[pos].shape != (t,) or sketches[pos].shape != (t, k) or probes[pos].shape[-1:] != (h,) \
                    or probes[pos].ndim != 2:
                raise ForensicsError(f"position {pos.label} has arrays of the wrong shape", path=p)
        if not norms:
            raise ForensicsError("holds no positions", path=p)
        # k is bounded by the t x k sketches the file holds, h by its probe rows (or, with none, by
        # the empty-shape bound): only then, and within MAX_PROJECTION, is the H x k projection built
        if h * k > MAX_PROJECTION:
            raise ForensicsError(f"claims hidden_size {h} with sketch k {k}: a {h} x {k} projection is past "
                                 f"{MAX_PROJECTION} values (no model is that wide): corrupt", path=p)
        if projection_digest(projection(h, k, seed)) != sk["projection_sha256"]:
            raise ForensicsError("the sketch projection does not regenerate identically (corrupt seed or k)", path=p)
        ids = doc.get("input_ids")
        layers = doc.get("num_layers")
        layers = None if layers is None else claimed_int(layers, "num_layers", p, lo=1, hi=MAX_KEY_NUMBER)
        return Fingerprint(
            str(p), f"fingerprint of {doc['source'].get('convention', '?')}", layers,
            f"fingerprint ({doc.get('num_layers_source', '?')})", h, t, _DTYPES.get(doc.get("dtype"), BF16),
            None if ids is None else np.array(ids, dtype=np.int64), k, seed,
            [int(i) for i in doc["probe_tokens"]], norms, sketches, probes, stats,
            {"source": doc.get("source"), "format": FORMAT},
        )
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise ForensicsError(f"corrupt fingerprint ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})",
                             path=p) from None
