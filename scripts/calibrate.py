"""Calibrate identity and fidelity (evidence.identity / evidence.fidelity) on tiny real models.

Runs three sets of alignments and prints the figures docs/calibration.md quotes:

* unrelated pairs: a record from one forward pass against a capture from another model or
  another prompt (families llama / qwen3 / deepseek_v3, float32 and bfloat16 passes, with
  and without token ids, so content alone must refuse): the false-confident rate must be 0;
* one-layer-off pairs: the record's aux positions are missing from the capture (a partial
  capture of the neighbours, or a full sweep with the true positions cut out), over three
  write dampings (neighbour cosines ~0.97 to ~0.9998): false-confident = a confident slot
  at a wrong position;
* drift pairs (the true positions captured): how many slots are placed, and at which
  robust score, paired bound and fidelity.

Not part of the test suite (tests/test_drift.py runs a slice). Usage:
    PYTHONPATH=$PWD python scripts/calibrate.py [--pairs 1000] [--seed 0] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from eagleforensics.alignment import align
from eagleforensics.positions import Position
from eagleforensics.testing import drift as D
from eagleforensics.testing.tinymodels import FAMILIES, build_model, prompt_ids

N, H, T = 8, 64, 32
AUX = [2, 4, 5]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).contiguous()


def _save_record(path: Path, s: D.States, ids: torch.Tensor | None, aux: list[int], final: bool = True) -> Path:
    obj: dict = {"hidden_states": [_bf16(s.raw[p]) for p in aux] + ([_bf16(s.normed)] if final else [])}
    if ids is not None:
        obj["input_ids"] = ids.clone()
    torch.save(obj, path)
    return path


def _save_capture(path: Path, s: D.States, ids: torch.Tensor | None, keep: list[int] | None = None) -> Path:
    """A full HF tuple (keep=None) or a vLLM-style dict holding raw positions ``keep`` only."""
    if keep is None:
        obj: dict = {"hidden_states": [x[None] for x in s.raw[:-1]] + [s.normed[None]]}
    else:
        obj = {f"h.{p}": s.raw[p].contiguous() for p in keep}
    if ids is not None:
        obj["input_ids"] = ids.clone()
    torch.save(obj, path)
    return path


class Pool:
    """Forward passes built once: (family, model seed, prompt seed, dtype, damping) -> States."""

    def __init__(self) -> None:
        self.models: dict[tuple, torch.nn.Module] = {}
        self.states: dict[tuple, D.States] = {}

    def get(self, family: str, mseed: int, pseed: int, dtype: str, damping: float = 0.25) -> D.States:
        key = (family, mseed, pseed, dtype, damping)
        if key not in self.states:
            mk = (family, mseed, damping)
            if mk not in self.models:
                self.models[mk] = build_model(family, num_layers=N, hidden=H, seed=mseed, damping=damping)
            self.states[key] = D.forward_states(self.models[mk], prompt_ids(T, seed=pseed), DTYPES[dtype])
        return self.states[key]


def _slot_rows(r, truth: list[Position], kind: str) -> list[dict]:
    out = []
    for m, want in zip(r.matches, truth):
        out.append({"kind": kind, "identity": m.identity_verdict, "confident": m.confident,
                    "right": m.best == want, "fidelity": m.fidelity, "cause": m.fidelity_cause,
                    "robust": m.robust_score, "bound": m.paired_bound, "step": m.neighbour_step,
                    "votes": m.vote_share, "tokens": m.tokens})
    return out


def unrelated(pool: Pool, rng: random.Random, pairs: int, tmp: Path) -> list[dict]:
    rows = []
    for i in range(pairs):
        fa, fb = rng.choice(FAMILIES), rng.choice(FAMILIES)
        da, db = rng.choice(list(DTYPES)), rng.choice(list(DTYPES))
        same_model = rng.random() < 0.5 and fa == fb
        ma = rng.randrange(3)
        mb = ma if same_model else (ma + 1 + rng.randrange(2)) % 3
        pa = rng.randrange(4)
        pb = (pa + 1 + rng.randrange(3)) % 4 if same_model else rng.randrange(4)
        rec_s, cap_s = pool.get(fa, ma, pa, da), pool.get(fb, mb, pb, db)
        with_ids = rng.random() < 0.25  # ids mostly stripped: content alone must refuse
        rec = _save_record(tmp / "u_rec.pt", rec_s, prompt_ids(T, seed=pa) if with_ids else None, AUX)
        cap = _save_capture(tmp / "u_cap.pt", cap_s, prompt_ids(T, seed=pb) if with_ids else None)
        r = align(rec, cap)
        for row in _slot_rows(r, [Position(p) for p in AUX] + [Position(N, True)], "unrelated"):
            row.update(pair=i, families=f"{fa}/{fb}", dtypes=f"{da}/{db}", same_model=same_model)
            rows.append(row)
    return rows


def one_layer_off(pool: Pool, tmp: Path) -> list[dict]:
    rows = []
    for family in FAMILIES:
        for damping in (0.25, 0.1, 0.05):
            for mseed in range(2):
                for dtype in DTYPES:
                    s = pool.get(family, mseed, 0, "float32", damping)
                    rec_s = pool.get(family, mseed, 0, dtype, damping)  # bf16: the record drifted too
                    ids = prompt_ids(T, seed=0)
                    truth = [Position(p) for p in AUX]
                    rec = _save_record(tmp / "o_rec.pt", rec_s, ids, AUX, final=False)
                    layouts = {"partial +1": [p + 1 for p in AUX], "partial -1": [p - 1 for p in AUX],
                               "full minus true": [p for p in range(N + 1) if p not in AUX]}
                    for name, keep in layouts.items():
                        cap = _save_capture(tmp / "o_cap.pt", s, ids, sorted(set(keep)))
                        r = align(rec, cap, convention="vllm", num_layers=N)
                        for row in _slot_rows(r, truth, "one-layer-off"):
                            row.update(family=family, damping=damping, dtype=dtype, layout=name,
                                       step=D.neighbour_cosine(s, 3))
                            rows.append(row)
    return rows


def drifted(pool: Pool, tmp: Path) -> list[dict]:
    """True positions captured, the capture drifted: MoE bf16 routing, INT4 weights, sdpa bf16."""
    rows = []
    ids = prompt_ids(T, seed=0)
    truth = [Position(p) for p in AUX] + [Position(N, True)]
    for mseed in range(3):
        moe = build_model("deepseek_v3", num_layers=N, hidden=H, seed=mseed)
        ref = D.forward_states(moe, ids)
        cases = {"moe bf16 routing": D.forward_states(moe, ids, torch.bfloat16)}
        for scope, group in (("experts", 128), ("all", 128), ("all", 32)):
            q, _ = D.fake_quant_int4(moe, scope, group)
            cases[f"int4 {scope} g{group}"] = D.forward_states(q, ids)
        llama = build_model("llama", num_layers=N, hidden=H, seed=mseed)
        cases["sdpa bf16 vs eager fp32"] = D.forward_states(llama, ids, torch.bfloat16, attn="sdpa")
        for name, s in cases.items():
            base = D.forward_states(llama, ids, attn="eager") if name.startswith("sdpa") else ref
            rec = _save_record(tmp / "d_rec.pt", s if name.startswith(("moe", "sdpa")) else base, ids, AUX)
            cap = _save_capture(tmp / "d_cap.pt", base if name.startswith(("moe", "sdpa")) else s, ids)
            r = align(rec, cap)
            for row in _slot_rows(r, truth, "drift"):
                row.update(case=name, seed=mseed, old_floor=r.thresholds.min_score)
                rows.append(row)
            for row, m in zip(rows[-len(truth):], r.matches):
                row["mean"] = m.score
    return rows


def summarise(rows: list[dict]) -> dict:
    out: dict = {}
    un = [r for r in rows if r["kind"] == "unrelated"]
    out["unrelated"] = {"pairs": len({r["pair"] for r in un}), "slots": len(un),
                        "confident": sum(r["confident"] for r in un),
                        "identity": dict(Counter(r["identity"] for r in un)),
                        "max_robust": max((r["robust"] for r in un if r["robust"] == r["robust"] and r["tokens"] >= 4),
                                          default=None),
                        "by_fidelity": dict(Counter(r["fidelity"] for r in un))}
    off = [r for r in rows if r["kind"] == "one-layer-off"]
    out["one_layer_off"] = {"slots": len(off), "false_confident": sum(r["confident"] and not r["right"] for r in off),
                            "identity": dict(Counter(r["identity"] for r in off)),
                            "by_damping": {str(d): dict(Counter(r["identity"] for r in off if r["damping"] == d))
                                           for d in sorted({r["damping"] for r in off})}}
    dr = [r for r in rows if r["kind"] == "drift"]
    cases: dict = {}
    for r in dr:
        c = cases.setdefault(r["case"], {"slots": 0, "placed_right": 0, "wrong_confident": 0, "old_floor_placed": 0,
                                         "fidelity": Counter(), "min_robust": 1.0, "min_bound": 1.0, "min_mean": 1.0})
        c["slots"] += 1
        c["placed_right"] += r["confident"] and r["right"]
        c["wrong_confident"] += r["confident"] and not r["right"]
        c["old_floor_placed"] += r["mean"] >= r["old_floor"]
        c["fidelity"][f"{r['fidelity']}/{r['cause']}" if r["cause"] else r["fidelity"]] += 1
        c["min_robust"] = min(c["min_robust"], r["robust"])
        c["min_bound"] = min(c["min_bound"], r["bound"]) if r["bound"] == r["bound"] else c["min_bound"]
        c["min_mean"] = min(c["min_mean"], r["mean"])
    out["drift"] = {k: {**v, "fidelity": dict(v["fidelity"])} for k, v in cases.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1000, help="unrelated record/capture pairs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write every slot's row here")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    pool = Pool()
    t0 = time.time()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as d:
        tmp = Path(d)
        rows = unrelated(pool, rng, args.pairs, tmp)
        rows += one_layer_off(pool, tmp)
        rows += drifted(pool, tmp)
    summary = summarise(rows)
    summary["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    bad = summary["unrelated"]["confident"] + summary["one_layer_off"]["false_confident"] + sum(
        v["wrong_confident"] for v in summary["drift"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
