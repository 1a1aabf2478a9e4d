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
  robust score, paired bound and fidelity;
* mid-layer states (issue 20): each decoder layer's residual after attention, before the MLP
  (the input of ``post_attention_layernorm``, what a fused add-norm returns as ``residual``) as a
  record slot against the full sweep: how many are called ``between`` the right two positions,
  and how many are still placed (at the nearer neighbour, as drift) with the fraction of the step
  they sit at;
* label and row cases (issue 20): a partial dict with the post-norm final at key N, a raw sweep
  read as HF against a speculators-style record, a list of the three aux states, flattened
  multi-request, left-padded and template-prefixed captures, with and without ids, and rows that
  all repeat one token: confident slots at a wrong position must be 0.

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
from eagleforensics.testing.tinymodels import FAMILIES, build_model, mid_layer_states, prompt_ids

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
                    "votes": m.vote_share, "tokens": m.tokens, "fraction": m.between_fraction,
                    "norm_ratio": m.norm_ratio})
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



def mid_layer(pool: Pool, tmp: Path) -> list[dict]:
    """Mid-layer states of layers 1..N-2 (both neighbours in an HF sweep) as bf16 record slots."""
    rows = []
    ids = prompt_ids(T, seed=0)
    for family in FAMILIES:
        for damping in (0.25, 0.1, 0.05):
            for mseed in range(2):
                pool.get(family, mseed, 0, "float32", damping)
                model = pool.models[(family, mseed, damping)]
                s = pool.get(family, mseed, 0, "float32", damping)
                mids = {k: v.float() for k, v in mid_layer_states(model, ids).items()}
                cap = _save_capture(tmp / "m_cap.pt", s, ids)
                for k in range(1, N - 1):
                    torch.save({"hidden_states": [_bf16(mids[k])], "input_ids": ids.clone()}, tmp / "m_rec.pt")
                    r = align(tmp / "m_rec.pt", cap)
                    m = r.matches[0]
                    pair = {m.best, m.other} == {Position(k), Position(k + 1)}
                    rows.append({"kind": "mid-layer", "family": family, "damping": damping, "seed": mseed, "layer": k,
                                 "identity": m.identity_verdict, "confident": m.confident, "right_pair": pair,
                                 "nearer": m.best.p if m.best is not None else None, "fraction": m.between_fraction,
                                 "fidelity": m.fidelity})
    return rows


def label_and_row_cases(pool: Pool, tmp: Path) -> list[dict]:
    """The label and row families of issue 20 on every model family (3 model seeds)."""
    rows = []
    truth = [Position(p) for p in AUX] + [Position(N, True)]

    def check(case: str, r, want: list[Position], family: str, seed: int) -> None:
        for m, w in zip(r.matches, want):
            rows.append({"kind": "cases", "case": case, "family": family, "seed": seed, "confident": m.confident,
                         "right": m.best == w, "identity": m.identity_verdict})

    for family in FAMILIES:
        for mseed in range(3):
            s = pool.get(family, mseed, 0, "float32")
            model = pool.models[(family, mseed, 0.25)]
            ids = prompt_ids(T, seed=0)
            rec = _save_record(tmp / "c_rec.pt", s, ids, AUX)
            rec_noids = _save_record(tmp / "c_rec0.pt", s, None, AUX)
            torch.save({f"h.{p}": s.raw[p] for p in AUX} | {f"h.{N}": s.normed, "input_ids": ids.clone()}, tmp / "c.pt")
            check("partial dict, post-norm at key N", align(rec, tmp / "c.pt"), truth, family, mseed)
            torch.save({"token_ids": ids.clone(), "hidden_states": torch.stack(
                [_bf16(s.raw[p]) for p in AUX + [N]], 1).contiguous()}, tmp / "c_spec.pt")
            torch.save({f"h.{p}": s.raw[p] for p in range(N + 1)} | {"input_ids": ids.clone()}, tmp / "c.pt")
            check("speculators record vs raw sweep read as hf", align(tmp / "c_spec.pt", tmp / "c.pt"),
                  [Position(p) for p in AUX + [N]], family, mseed)
            torch.save({"hidden_states": [s.raw[p][None] for p in AUX], "input_ids": ids.clone()}, tmp / "c.pt")
            check("list of three aux states", align(rec, tmp / "c.pt"), truth, family, mseed)
            reqs = [prompt_ids(23, seed=11), ids, prompt_ids(17, seed=12)]
            sts = [D.forward_states(model, q) for q in reqs]
            flat = D.States([torch.cat([x.raw[p] for x in sts]) for p in range(N + 1)],
                            torch.cat([x.normed for x in sts]), {})
            for with_ids in (True, False):
                tag = "ids" if with_ids else "no ids"
                cap = _save_capture(tmp / "c.pt", flat, torch.cat(reqs) if with_ids else None)
                check(f"flattened, {tag}", align(rec if with_ids else rec_noids, cap), truth, family, mseed)
                pad = 5
                padded = torch.cat([torch.zeros(pad, dtype=torch.long), ids])
                mask = torch.cat([torch.zeros(pad), torch.ones(T)]).long()
                with torch.no_grad():
                    hs = model(padded[None], attention_mask=mask[None], output_hidden_states=True).hidden_states
                torch.save({"hidden_states": [h.float() for h in hs]} | ({"input_ids": padded} if with_ids else {}),
                           tmp / "c.pt")
                check(f"left-padded, {tag}", align(rec if with_ids else rec_noids, tmp / "c.pt"), truth, family, mseed)
                templ = torch.cat([torch.tensor([1, 7, 8, 9, 10, 11]), ids[1:]])
                cap = _save_capture(tmp / "c.pt", D.forward_states(model, templ), templ if with_ids else None)
                check(f"template prefix, {tag}", align(rec if with_ids else rec_noids, cap), truth, family, mseed)
            one = D.States([x[7:8].repeat(T, 1) for x in s.raw], s.normed[7:8].repeat(T, 1), {})
            check("identical rows", align(_save_record(tmp / "c_rec1.pt", one, None, AUX),
                                          _save_capture(tmp / "c.pt", one, None)), truth, family, mseed)
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
        if r["fraction"] == r["fraction"]:  # how far toward a neighbour the true drifted match sits
            c["max_fraction"] = max(c.get("max_fraction", -1.0), r["fraction"])
        if r["confident"] and r["right"] and r["norm_ratio"] == r["norm_ratio"]:  # fidelity.DRIFT_NORM_LIMIT
            c["norm_ratio_range"] = [min(c.get("norm_ratio_range", [9e9])[0], r["norm_ratio"]),
                                     max(c.get("norm_ratio_range", [0, -9e9])[1], r["norm_ratio"])]
    out["drift"] = {k: {**v, "fidelity": dict(v["fidelity"])} for k, v in cases.items()}
    mid = [r for r in rows if r["kind"] == "mid-layer"]
    if mid:
        fr = [r["fraction"] for r in mid if r["fraction"] == r["fraction"]]
        out["mid_layer"] = {"states": len(mid), "identity": dict(Counter(r["identity"] for r in mid)),
                            "between_right_pair": sum(r["identity"] == "between" and r["right_pair"] for r in mid),
                            "placed_at_nearer_neighbour": sum(r["confident"] for r in mid),
                            "max_fraction_placed": max((r["fraction"] for r in mid if r["confident"]
                                                        and r["fraction"] == r["fraction"]), default=None),
                            "min_fraction_between": min((r["fraction"] for r in mid if r["identity"] == "between"),
                                                        default=None),
                            "median_fraction": sorted(fr)[len(fr) // 2] if fr else None,
                            "by_family": {f: dict(Counter(r["identity"] for r in mid if r["family"] == f))
                                          for f in sorted({r["family"] for r in mid})}}
    cs = [r for r in rows if r["kind"] == "cases"]
    if cs:
        out["cases"] = {c: {"slots": sum(r["case"] == c for r in cs),
                            "placed_right": sum(r["case"] == c and r["confident"] and r["right"] for r in cs),
                            "wrong_confident": sum(r["case"] == c and r["confident"] and not r["right"] for r in cs),
                            "identity": dict(Counter(r["identity"] for r in cs if r["case"] == c))}
                        for c in dict.fromkeys(r["case"] for r in cs)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1000, help="unrelated record/capture pairs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write every slot's row here")
    ap.add_argument("--sets", default="unrelated,off,drift,mid,cases",
                    help="comma-separated sets to run (unrelated, off, drift, mid, cases)")
    args = ap.parse_args()
    sets = set(args.sets.split(","))
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    pool = Pool()
    t0 = time.time()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as d:
        tmp = Path(d)
        rows = unrelated(pool, rng, args.pairs, tmp) if "unrelated" in sets else []
        rows += one_layer_off(pool, tmp) if "off" in sets else []
        rows += drifted(pool, tmp) if "drift" in sets else []
        rows += mid_layer(pool, tmp) if "mid" in sets else []
        rows += label_and_row_cases(pool, tmp) if "cases" in sets else []
    summary = summarise(rows)
    summary["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    bad = summary["unrelated"]["confident"] + summary["one_layer_off"]["false_confident"] + sum(
        v["wrong_confident"] for v in summary["drift"].values()) + sum(
        v["wrong_confident"] for v in summary.get("cases", {}).values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
