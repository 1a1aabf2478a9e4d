"""Synthetic capture sweeps at real model shapes, written once, streamed to disk position by position.

Each position is a random-walk step from the previous one (neighbouring layers sit at cosine
~0.99, as in trained models), token 0 carries a massive activation in two dimensions from
p=2 on, and the post-norm final is an RMSNorm with a random gain of the last raw state. The
file is the capture helper's safetensors format (``hidden.0..N``, ``final_norm``,
``input_ids``, metadata), written without ever holding the sweep in memory. ``last="raw"`` leaves
``final_norm`` out: the sweep ends with the raw last state, as speculators' records and engines' hooks
write it, so align places the record's post-norm final by fitting the norm's gain. The training
record holds three positions and the post-norm final, bf16, written three times: in SpecForge's
layout as its ``.ckpt`` (``input_ids``, ``loss_mask``, ``hidden_state`` [1, S, H], ``aux_hidden_state``
[1, S, 3H], as ``torch.save`` writes it), and in the list layout as ``.pt`` and as safetensors.

These tensors are hand-made on purpose: they exist to measure speed and memory at shapes no
test can afford. Matching behaviour is tested on real forward passes (tests/).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from eagleforensics.io.capture import CAPTURE_FORMAT, META_KEY

SHAPES = {"kimi-k2": (61, 7168), "llama-8b": (32, 4096)}
STEP = 0.15  # random-walk step / rms: neighbour cosine about 0.99
MASSIVE = (3, 17)


@dataclass(frozen=True)
class Sweep:
    """Paths of one synthetic sweep and the positions its training record holds (ground truth)."""

    capture: Path
    record: Path  # the training record as torch.save writes it (.pt: reading it imports torch)
    num_layers: int
    hidden: int
    tokens: int
    aux_positions: tuple[int, int, int]

    @property
    def record_safetensors(self) -> Path:
        """The same record as safetensors (list layout ``hidden_states.0..3``)."""
        return self.record.with_suffix(".safetensors")

    @property
    def record_ckpt(self) -> Path:
        """The same record in SpecForge's layout, as its ``.ckpt`` (a torch zip archive)."""
        return self.record.with_suffix("").with_suffix(".ckpt")

    def record_as(self, kind: str) -> Path:
        """The record file of ``kind``: ckpt, safetensors or pt."""
        return {"ckpt": self.record_ckpt, "safetensors": self.record_safetensors, "pt": self.record}[kind]

    @property
    def capture_bytes(self) -> int:
        return self.capture.stat().st_size


def record_positions(n: int) -> tuple[int, int, int]:
    """Layer outputs [2, N//2, N-3] as SGLang ids, i.e. positions p = [3, N//2+1, N-2]."""
    return (3, n // 2 + 1, n - 2)


LASTS = ("postnorm", "raw")  # what a sweep's last entry is: the post-norm final, or the raw last state


def _header(n: int, t: int, h: int, last: str = "postnorm") -> tuple[bytes, list[str]]:
    names = [f"hidden.{p}" for p in range(n + 1)] + (["final_norm"] if last == "postnorm" else [])
    header: dict[str, object] = {}
    offset = 0
    for name in names:
        size = t * h * 2
        header[name] = {"dtype": "BF16", "shape": [t, h], "data_offsets": [offset, offset + size]}
        offset += size
    header["input_ids"] = {"dtype": "I64", "shape": [t], "data_offsets": [offset, offset + 8 * t]}
    meta = {"format": CAPTURE_FORMAT, "model_type": "synthetic", "num_hidden_layers": str(n),
            "hidden_size": str(h), "dtype": "bfloat16"}
    header["__metadata__"] = {META_KEY: json.dumps(meta, sort_keys=True)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, names


def write_sweep(folder: Path, shape: str, tokens: int, seed: int = 0, last: str = "postnorm") -> Sweep:
    """Write ``{shape}-T{tokens}.safetensors`` (``-rawlast`` for ``last="raw"``) and its training record into
    ``folder`` (reused if present). The record is the same for both kinds of sweep."""
    n, h = SHAPES[shape]
    stem = f"{shape}-T{tokens}" + ("" if last == "postnorm" else "-rawlast")
    cap = folder / f"{stem}.safetensors"
    rec = folder / f"{stem}.record.pt"
    aux = record_positions(n)
    sweep = Sweep(cap, rec, n, h, tokens, aux)
    if cap.exists() and rec.exists() and sweep.record_safetensors.exists() and sweep.record_ckpt.exists():
        return sweep
    gen = torch.Generator().manual_seed(seed)
    head, names = _header(n, tokens, h, last)
    ids = torch.randint(3, 32000, (tokens,), generator=gen)
    ids[0] = 1
    kept: dict[int, torch.Tensor] = {}
    # per-token scales vary as in real residual streams (a nearly constant norm would look post-norm)
    x = torch.randn((tokens, h), generator=gen) * torch.exp(0.4 * torch.randn((tokens, 1), generator=gen))
    with cap.open("wb") as fh:
        fh.write(head)
        for p in range(n + 1):
            if p > 0:
                rms = x.pow(2).mean(-1, keepdim=True).sqrt()
                x += STEP * rms * torch.randn((tokens, h), generator=gen)
            if p == 2:
                x[0, list(MASSIVE)] = 300.0 * x[1:].abs().mean()
            xb = x.to(torch.bfloat16)
            fh.write(xb.view(torch.uint8).numpy().tobytes())
            if p in aux:
                kept[p] = xb.clone()
        gain = 1.0 + 0.5 * torch.randn(h, generator=gen)
        final = (gain * x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()).to(torch.bfloat16)
        if last == "postnorm":
            fh.write(final.view(torch.uint8).numpy().tobytes())
        fh.write(ids.to(torch.int64).numpy().tobytes())
    assert names[-1] == ("final_norm" if last == "postnorm" else f"hidden.{n}")
    states = [kept[p] for p in aux] + [final]
    torch.save({"hidden_states": states, "input_ids": ids.clone()}, rec)
    save_file({**{f"hidden_states.{i}": s.contiguous() for i, s in enumerate(states)}, "input_ids": ids.clone()},
              str(sweep.record_safetensors))
    torch.save({"input_ids": ids.clone(), "loss_mask": torch.ones(tokens, dtype=torch.int64),
                "hidden_state": final[None].clone(), "aux_hidden_state": torch.cat(states[:3], -1)[None].clone()},
               sweep.record_ckpt)
    return sweep
