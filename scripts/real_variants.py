"""Issue 43's 16 doctor variants on the real pair (SmolLM2-135M-Instruct and the recipe's drafter): plant, diagnose, table.

Each variant copies the drafter (or writes records / served prompts) into a temp folder, runs the in-process
``doctor.diagnose`` on a few training records (the recipe's first training prompts, answered again greedily) and
the capture of one of their sequences, and prints one row: what was
expected (OK, or the code / cause that must be flagged), what the doctor said (level and flagged codes), whether
they agree, and whether every error / warning of the JSON belongs to a cause (issue 43 defect 4). data-size is
skipped where a handful of records would rightly be called too little data (the row says so).

    PYTHONPATH=$PWD EAGLEFORENSICS_FUSED=0 python scripts/real_variants.py [--json OUT] [--only NAME,...]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from eagleforensics.checks.base import FLAGGED, DoctorInputs
from eagleforensics.doctor import diagnose
from eagleforensics.testing import realsamples, realtarget

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "data_samples" / "real"
RECORDS = 4  # training sequences written as records (the capture is the first one's whole sequence)
PROMPTS, MAX_NEW = 96, 32  # the recipe's prompts and answer budget (scripts/make_real_samples.py defaults)
TRAINED = (2, 15, 27)  # the records' positions: SpecForge's default aux ids [1, 14, 26] for 30 layers
OTHER_SYSTEM = "You are a helpful assistant."  # SpecForge's qwen-style system prompt, not SmolLM2's default


@dataclass
class Variant:
    """One row: how to make it, the doctor inputs, and what must (or must not) be flagged."""

    name: str
    what: str
    expect: str  # "OK", or a code / cause key that must be flagged
    inputs: Callable[[dict[str, Any], Path], dict[str, Any]]
    not_problem: bool = False  # expect OK or at most ACTION (never PROBLEM)
    observation: bool = False  # not one of the variants: shown, not counted (docs/real-pair.md says why)
    notes: list[str] = field(default_factory=list)


def _drafter(tmp: Path, config: Callable[[dict], None] | None = None,
             weights: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None) -> str:
    d = tmp / "drafter"
    shutil.copytree(REAL / "drafter", d)
    if config is not None:
        cfg = json.loads((d / "config.json").read_text())
        config(cfg)
        (d / "config.json").write_text(json.dumps(cfg, indent=2))
    if weights is not None:
        t = weights(load_file(str(d / "model.safetensors")))
        save_file({k: v.contiguous() for k, v in t.items()}, str(d / "model.safetensors"), metadata={"format": "pt"})
    return str(d)


def _nested(ids: list[int]) -> Callable[[dict], None]:
    return lambda cfg: cfg["eagle_config"].__setitem__("eagle_aux_hidden_state_layer_ids", ids)


def _top(ids: list[int]) -> Callable[[dict], None]:
    return lambda cfg: cfg.__setitem__("eagle_aux_hidden_state_layer_ids", ids)


def _random_embedding(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t["embed_tokens.weight"] = (torch.randn(49152, 576, generator=g) * 0.02).to(torch.bfloat16)
    return t


def _served(ctx: dict[str, Any], tmp: Path, raw: bool) -> str:
    path = tmp / "served.jsonl"
    rows = [{"prompt": p} if raw else {"messages": [{"role": "user", "content": p}]} for p in ctx["prompts"]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _records(ctx: dict[str, Any], tmp: Path, seqs: list[tuple[list[int], int]], keep_answers: bool) -> str:
    """Records of ``seqs`` at TRAINED from a real forward; ``keep_answers`` keeps answers the target would not
    write (features cuts an answer at its first non-greedy token: given the whole sequence as prompt it cuts
    nothing, and the loss mask is then set over the answer)."""
    out = tmp / "train"
    fed = [(s, len(s)) if keep_answers else (s, p) for s, p in seqs]
    for i, (it, (_, p)) in enumerate(zip(realsamples.features(ctx["model"], fed, TRAINED), seqs)):
        if keep_answers:
            t = len(it["ids"])
            it["loss_mask"] = torch.cat([torch.zeros(p), torch.ones(t - p)]).long()
        realsamples.write_record(it, TRAINED, out / f"data_{i}.ckpt")
    return str(out)


HUMAN = (  # answers people wrote (not the target): SpecForge#533's "98% in training, 10% served"
    "Honestly it depends on who you ask, but most folks I know would say it's overrated and a bit of a fad.",
    "Ok so here's the thing - my grandad kept a notebook about this for forty years and never agreed with anyone.",
    "Nope. Not doing a list. Go read the Wikipedia page, it's decent, then come back and we'll argue about it.",
    "Short version: it's complicated; long version: see chapter 4 of the textbook our teacher made us buy in 2009.",
)


def _other_answers(ctx: dict[str, Any], tmp: Path) -> dict[str, Any]:
    tok, end = ctx["tok"], ctx["tok"].convert_tokens_to_ids("<|im_end|>")
    seqs = [(s[:p] + tok.encode(text, add_special_tokens=False) + [end], p)
            for (s, p), text in zip(ctx["seqs"], HUMAN)]
    return {"train": _records(ctx, tmp, seqs, keep_answers=True)}


def _other_system(ctx: dict[str, Any], tmp: Path) -> dict[str, Any]:
    tok, seqs = ctx["tok"], []
    for prompt, (s, p) in zip(ctx["prompts"], ctx["seqs"]):
        out = tok.apply_chat_template([{"role": "system", "content": OTHER_SYSTEM},
                                       {"role": "user", "content": prompt}], add_generation_prompt=True,
                                      tokenize=True)
        ids = [int(t) for t in (out["input_ids"] if hasattr(out, "keys") else out)]
        seqs.append((ids + s[p:], len(ids)))
    return {"train": _records(ctx, tmp, seqs, keep_answers=False)}


V33, S23 = {"engine": "vllm", "engine_version": "0.33.0"}, {"engine": "sglang", "engine_version": "0.5.23"}
VARIANTS = [
    Variant("clean-no-engine", "the drafter as trained, no engine", "OK", lambda c, t: {}),
    Variant("clean-sglang", "as trained, SGLang 0.5.23", "OK", lambda c, t: dict(S23)),
    Variant("clean-vllm", "as trained, vLLM 0.33.0 (its default runner)", "OK", lambda c, t: dict(V33)),
    Variant("clean-served-prompts", "as trained, the chat requests as --served-prompts", "OK",
            lambda c, t: {"served_prompts": _served(c, t, raw=False)}),
    Variant("one-off-vllm", "top-level ids [1, 14, 26] (SpecForge's ids copied for vLLM, which reads them as "
            "p1, p14, p26)", "wiring", lambda c, t: {"drafter": _drafter(t, _top([1, 14, 26])), **V33}),
    Variant("one-off-sglang", "the incident: nested ids [2, 15, 27] on SGLang 0.5.23 (trained [1, 14, 26])",
            "wiring", lambda c, t: {"drafter": _drafter(t, _nested([2, 15, 27])), **S23}),
    Variant("nested-only-vllm-v1", "nested ids only [2, 15, 27] on vLLM 0.33.0's V1 runner (reads the nested key, "
            "p2, p15, p27 = trained)", "OK",
            lambda c, t: {"drafter": _drafter(t, _nested([2, 15, 27])), **V33, "vllm_runner": "v1"}),
    Variant("wrong-fix", "the wrong fix: nested ids [0, 1, 2] on SGLang 0.5.23", "wiring",
            lambda c, t: {"drafter": _drafter(t, _nested([0, 1, 2])), **S23}),
    Variant("random-embed-vllm", "a random embed_tokens in the drafter, served by vLLM 0.33.0", "embedding-random",
            lambda c, t: {"drafter": _drafter(t, weights=_random_embedding), **V33}),
    Variant("random-embed-sglang", "a random embed_tokens, SGLang 0.5.23 (replaces it with the target's)",
            "not PROBLEM", lambda c, t: {"drafter": _drafter(t, weights=_random_embedding), **S23}, not_problem=True),
    Variant("d2t-dropped", "d2t dropped from the drafter's weights", "d2t-missing",
            lambda c, t: {"drafter": _drafter(t, weights=lambda w: {k: v for k, v in w.items() if k != "d2t"})}),
    Variant("answers-not-target", "records whose answers people wrote (four short human replies, not the target's)",
            "data-not-from-target", _other_answers),
    Variant("raw-completions", "raw prompt text served as completions (--served-prompts)", "template",
            lambda c, t: {"served_prompts": _served(c, t, raw=True)}),
    Variant("other-system-prompt", f"records rendered with system prompt {OTHER_SYSTEM!r}, served with the "
            "default one", "template-mismatch", _other_system),
    Variant("vllm-runner-v1", "the clean drafter (nested [1, 14, 26]) on vLLM 0.33.0 --vllm-runner v1: p1, p14, "
            "p26 served", "wiring", lambda c, t: {**V33, "vllm_runner": "v1"}),
    Variant("clean-heldout-records", "as trained, but --train holds 4 held-out sequences (not training data) and "
            "the capture is one of them", "OK", lambda c, t: {"train": c["held_train"], "capture": c["held_capture"]},
            observation=True),
]


def _setup(work: Path) -> dict[str, Any]:
    """The target, RECORDS training sequences answered again greedily (the recipe's first training prompts: the
    drafter learned on these), their records at TRAINED, and the capture of record 0's whole sequence (as
    ``capture --input-ids`` from the record gives); the held-out sequences for the held-out row."""
    target = realtarget.target_dir()
    model, tok = realtarget.load(target)
    prompts = realsamples.prompts(PROMPTS)[:RECORDS]  # the recipe's first training prompts (the last 32 are held out)
    items = realsamples.generate_features(model, tok, prompts, MAX_NEW, ())
    ctx: dict[str, Any] = {"target": str(target), "model": model, "tok": tok, "prompts": prompts,
                           "seqs": [(it["ids"].tolist(), it["prompt_tokens"]) for it in items]}
    ctx["train"] = _records(ctx, work, ctx["seqs"], keep_answers=False)
    ctx["capture"] = _capture(target, work / "capture", ctx["seqs"][0][0])
    held = realsamples.read_heldout(REAL / "heldout.jsonl")[:RECORDS]
    ctx["held_train"] = _records(ctx, work / "held", [(h["input_ids"], h["prompt_tokens"]) for h in held], False)
    ctx["held_capture"] = _capture(target, work / "held-capture", held[0]["input_ids"])
    return ctx


def _capture(target: Path, out: Path, ids: list[int]) -> str:
    from eagleforensics.io.captureset import capture_many

    out.mkdir(parents=True)
    (out / "request.jsonl").write_text(json.dumps({"input_ids": ids}) + "\n")
    caps, _, _ = capture_many(target, out / "request.jsonl", out / "captures", dtype="bfloat16")
    return str(sorted(caps.glob("seq-*.safetensors"))[0])


def _flagged(report: Any) -> list[str]:
    return list(dict.fromkeys([*(c.key for c in report.causes), *(r.finding.code for r in report.flagged)]))


def judge(v: Variant, report: Any) -> tuple[bool, bool, str]:
    """(agree, json agrees with the text, detail)."""
    data = json.loads(report.to_json())
    causes = {c["key"] for c in data["causes"]}
    stray = [f["code"] for f in data["findings"] if f["severity"] in FLAGGED and f.get("cause") not in causes]
    text = report.to_text()
    json_ok = (not stray and data["level"] == report.level and f"VERDICT: {data['level']}" in text
               and all(c["key"] in text for c in data["causes"]))
    flagged = _flagged(report)
    if v.not_problem:
        agree = report.level != "PROBLEM"
    elif v.expect == "OK":
        agree = report.level == "OK"
    else:
        agree = report.level != "OK" and any(v.expect in f for f in flagged)
    return agree, json_ok, ("stray " + ",".join(stray)) if stray else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--only", help="comma-separated variant names")
    ap.add_argument("--text", help="a folder for each variant's doctor text")
    a = ap.parse_args()
    pick = set(a.only.split(",")) if a.only else None
    rows = []
    with tempfile.TemporaryDirectory(prefix="realvariants-") as tmpdir:
        work = Path(tmpdir)
        t0 = time.time()
        ctx = _setup(work)
        print(f"setup {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
        for i, v in enumerate(VARIANTS, 1):
            if pick and v.name not in pick:
                continue
            case = work / v.name
            case.mkdir()
            got = {"drafter": str(REAL / "drafter"), "target": ctx["target"], "train": ctx["train"],
                   "capture": ctx["capture"], "skip": ("data-size",)}
            got.update(v.inputs(ctx, case))
            t1 = time.time()
            report = diagnose(DoctorInputs(**got))
            agree, json_ok, detail = judge(v, report)
            if a.text:
                Path(a.text).mkdir(parents=True, exist_ok=True)
                (Path(a.text) / f"{i:02d}-{v.name}.txt").write_text(report.to_text())
            row = {"n": i, "variant": v.name, "what": v.what, "expected": v.expect, "level": report.level,
                   "flagged": _flagged(report), "agree": agree, "json_agrees": json_ok, "detail": detail,
                   "capture": got["capture"] is not None, "skipped": list(got["skip"]),
                   "seconds": round(time.time() - t1), "observation": v.observation}
            rows.append(row)
            print(f"{i:2d} {v.name:22s} expected {v.expect:22s} got {report.level:7s} "
                  f"{','.join(row['flagged']) or '-':40s} agree {'yes' if agree else 'NO'} "
                  f"json {'yes' if json_ok else 'NO'} {detail} ({row['seconds']}s)", flush=True)
    counted = [r for r in rows if not r["observation"]]
    good = sum(r["agree"] and r["json_agrees"] for r in counted)
    print(f"{good} of {len(counted)} variants right (agree and JSON = text); JSON = text on "
          f"{sum(r['json_agrees'] for r in rows)} of {len(rows)} rows")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if good == len(counted) and all(r["json_agrees"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
