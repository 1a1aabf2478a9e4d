"""Whether a regenerated data_samples/ is the shipped one by what matters, on any CPU.

The float values of a forward pass depend on the CPU's vector path (summation order in a
matmul), so a capture regenerated on another machine differs from the shipped one in the last
bits; byte-for-byte comparison then fails on a correct checkout. What must hold instead:

* the same files, and per file the same structure, compared exactly: the torch archive's
  member names and its pickle (keys, list layout, dtypes, shapes, strides: no float values in
  it), the safetensors header (names, dtypes, shapes, offsets, metadata);
* every integer or bool tensor (token ids, loss masks) equal bit for bit;
* every float tensor within its dtype's tolerance (``TOLERANCE``: one bf16/fp16 rounding step,
  a forward pass's float32 error), NaN/Inf at the same places;
* the same verdict and placements when each record is aligned with the capture (``verdicts``).
"""
from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

# dtype -> (relative tolerance, absolute tolerance as a fraction of the tensor's largest |value|)
TOLERANCE = {
    torch.bfloat16: (2.0 ** -7, 1e-5),  # 8 significant bits: a float32 nudged across a rounding edge moves one step
    torch.float16: (2.0 ** -10, 1e-5),
    torch.float32: (1e-4, 1e-5),  # the float32 error a 12-layer forward pass accumulates, with margin
    torch.float64: (1e-10, 1e-12),
}
# record -> capture pairs whose verdicts must agree (README of data_samples)
PAIRS = [("record_layer_outputs.pt", "capture.pt"), ("record_layer_outputs.safetensors", "capture_sweep.safetensors"),
         ("record_wrong_fix.pt", "capture.pt"), ("data_0.ckpt", "capture.pt")]


def _load(path: Path) -> Any:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, weights_only=True, map_location="cpu")


def _structure(path: Path) -> Any:
    """What must be equal byte for byte: the archive's member names and pickle, or the safetensors header."""
    if path.suffix == ".safetensors":
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        return json.loads(raw[8:8 + n])
    with zipfile.ZipFile(path) as zf:
        names = sorted(zf.namelist())
        # the records (data/<n>) hold the values; serialization_id is a digest of them: all else is exact
        return names, {n: zf.read(n) for n in names
                       if n.split("/")[-2:-1] != ["data"] and not n.endswith("/.data/serialization_id")}


def _compare(a: Any, b: Any, where: str, problems: list[str]) -> None:
    if isinstance(b, dict):
        if not isinstance(a, dict) or list(a) != list(b):
            problems.append(f"{where}: keys {list(a) if isinstance(a, dict) else type(a).__name__} != {list(b)}")
            return
        for k in b:
            _compare(a[k], b[k], f"{where}[{k!r}]", problems)
    elif isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            problems.append(f"{where}: {type(a).__name__} of {len(a) if hasattr(a, '__len__') else '?'} != "
                            f"{type(b).__name__} of {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            _compare(x, y, f"{where}[{i}]", problems)
    elif isinstance(b, torch.Tensor):
        _compare_tensor(a, b, where, problems)
    elif a != b:
        problems.append(f"{where}: {a!r} != {b!r}")


def _compare_tensor(a: Any, b: torch.Tensor, where: str, problems: list[str]) -> None:
    if not isinstance(a, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride():
        problems.append(f"{where}: {getattr(a, 'dtype', type(a))} {list(getattr(a, 'shape', []))} != "
                        f"{b.dtype} {list(b.shape)}")
        return
    if not b.is_floating_point():
        if not torch.equal(a, b):
            problems.append(f"{where}: integer values differ")
        return
    x, y = a.double(), b.double()
    if not torch.equal(torch.isfinite(x), torch.isfinite(y)) or not torch.equal(x.isnan(), y.isnan()):
        problems.append(f"{where}: NaN/Inf at other places")
        return
    rtol, scale = TOLERANCE[b.dtype]
    fin = torch.isfinite(y)
    x, y = x[fin], y[fin]
    if not y.numel():
        return
    atol = scale * float(y.abs().max())
    bad = (x - y).abs() > rtol * torch.maximum(x.abs(), y.abs()) + atol
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        problems.append(f"{where}: {int(bad.sum())} of {y.numel()} values differ past the {b.dtype} tolerance "
                        f"(first: {float(x[i])!r} vs {float(y[i])!r})")


def compare_files(regenerated: Path, shipped: Path) -> list[str]:
    """What differs between a regenerated sample and the shipped one beyond another CPU's rounding."""
    problems: list[str] = []
    if _structure(regenerated) != _structure(shipped):
        problems.append(f"{shipped.name}: structure differs (archive members and pickle, or safetensors header)")
    _compare(_load(regenerated), _load(shipped), shipped.name, problems)
    return problems


def verdicts(folder: Path) -> dict[str, tuple[str, list[Any]]]:
    """Per record/capture pair: the verdict level and each slot's placement (position, post-norm, confident)."""
    from eagleforensics.alignment import align

    out = {}
    for record, capture in PAIRS:
        res = align(folder / record, folder / capture).to_dict()
        out[f"{record} vs {capture}"] = (res["level"], [(m["position"], m["post_norm"], m["confident"])
                                                        for m in res["mapping"]])
    return out


def compare_samples(regenerated: Path, shipped: Path) -> list[str]:
    """Every difference that matters between two data_samples folders (empty: the same samples)."""
    names = sorted(p.name for p in shipped.iterdir() if p.is_file() and p.name != "README.md")
    got = sorted(p.name for p in regenerated.iterdir() if p.is_file() and p.name != "README.md")
    if got != names:
        return [f"files {got} != {names}"]
    problems = [p for name in names for p in compare_files(regenerated / name, shipped / name)]
    mine, theirs = verdicts(regenerated), verdicts(shipped)
    problems += [f"{pair}: verdict {mine[pair]} != {theirs[pair]}" for pair in theirs if mine[pair] != theirs[pair]]
    return problems


def nudge_last_bits(src: Path, dst: Path, fraction: float = 0.05, seed: int = 0) -> None:
    """Copy a samples folder, moving ``fraction`` of every float tensor's values by one step of their dtype
    (up or down): what the same forward pass computes on a CPU with another vector path."""
    from safetensors.torch import save_file

    from eagleforensics.io.capture import META_KEY

    rng = np.random.default_rng(seed)

    def nudge(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: nudge(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [nudge(v) for v in obj]
        if isinstance(obj, torch.Tensor) and obj.is_floating_point():
            t = obj.clone()
            bits = t.view(-1).view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
            vals = t.view(-1)
            pick = torch.from_numpy(rng.random(vals.numel()) < fraction) & torch.isfinite(vals) & (vals != 0) \
                & (vals.abs() < torch.finfo(t.dtype).max)
            step = torch.from_numpy(np.where(rng.random(vals.numel()) < 0.5, 1, -1)).to(bits.dtype)
            bits[pick] += step[pick]  # one unit in the last place, up or down in magnitude
            return t
        return obj

    dst.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.iterdir()):
        if not p.is_file() or p.name == "README.md":
            continue
        if p.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(p), "pt") as fh:
                meta = fh.metadata()
            save_file(nudge(_load(p)), str(dst / p.name), metadata=meta if meta and META_KEY in meta else meta)
        else:
            torch.save(nudge(_load(p)), dst / p.name)
