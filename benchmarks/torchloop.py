"""A plain torch loop over a capture sweep: the baseline that shows what tensor code alone reaches.

    python benchmarks/torchloop.py CAPTURE.safetensors RECORD.safetensors

Reads every position of the capture helper's safetensors file (``safe_open``, torch tensors),
widens it to float32 and computes what the scorer's single pass computes: each row's squared
norm, its dot product with every training slot, and its product with the position below. One
torch operation per quantity, each a pass over memory: the way most comparison scripts are
written. Not the product; ``bench_align.py`` times it beside ``align``. Prints one JSON line.
"""
from __future__ import annotations

import json
import sys
import time

import torch
from safetensors import safe_open


def main() -> None:
    capture, record = sys.argv[1], sys.argv[2]
    t0 = time.perf_counter()
    with safe_open(record, "pt") as f:
        keys = sorted((k for k in f.keys() if k.startswith("hidden_states.")), key=lambda k: int(k.split(".")[1]))
        y = torch.stack([f.get_tensor(k).float() for k in keys], 1)  # [T, K, H]
    checksum = 0.0
    with safe_open(capture, "pt") as f:
        names = sorted((k for k in f.keys() if k.startswith("hidden.")), key=lambda k: int(k.split(".")[1]))
        prev = None
        for name in names + ["final_norm"]:
            x = f.get_tensor(name).float()
            xx = x.square().sum(-1)
            dots = torch.einsum("th,tkh->tk", x, y[: x.shape[0]])
            adj = (x * prev).sum(-1) if prev is not None else xx
            checksum += float(xx.sum() + dots.sum() + adj.sum())
            prev = x
    print(json.dumps({"seconds": time.perf_counter() - t0, "positions": len(names) + 1, "checksum": checksum}))


if __name__ == "__main__":
    main()
