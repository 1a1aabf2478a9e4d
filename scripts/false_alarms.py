"""Count the doctor's false alarms: clean drafters of other seeds, families and RoPE settings, each checked in full.

For every tiny target (Llama, Qwen3, DeepSeek-V3 shapes from ``testing.tinymodels``; each seed with
the default RoPE and with the family's scaled RoPE), ``testing.drafterbuild`` exports a correctly
made drafter (SpecForge, speculators and ModelOpt layouts, each fitted on the target's own sequences), a training record at the engines' default
positions and a capture; the doctor runs on all of it, without an engine and for each engine that
loads the layout (SGLang through a clean server log in its 0.5.23 format, so the launch checks run
too; vLLM at the newest release the rules read). Nothing is wrong in any case, so every
PROBLEM is a false PROBLEM and every ACTION a false ACTION. Prints one line per case and the
counts per family; exit 1 on any false PROBLEM.

    python scripts/false_alarms.py [--seeds 1 2 3] [--layers 8] [--families llama qwen3 deepseek_v3]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from eagleforensics.alignment import align
from eagleforensics.checks.base import DoctorInputs
from eagleforensics.doctor import diagnose
from eagleforensics.testing.defects import sglang_log
from eagleforensics.testing.drafterbuild import export_drafter, export_target, write_capture, write_record
from eagleforensics.testing.tinymodels import FAMILIES, SCALED_ROPE, build_model

LAYOUTS = ("specforge", "speculators", "modelopt")
# the engines each layout is checked against (None: no engine); SGLang has no loader for the speculators
# layout (engines.flagtable), so refusing it there is right, not a false alarm, and is not run
ENGINES = {"specforge": (None, "sglang", "vllm"), "speculators": (None, "vllm"), "modelopt": (None, "sglang", "vllm")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    args = ap.parse_args()
    counts: dict[str, Counter] = {f: Counter() for f in args.families}
    codes: dict[str, Counter] = {f: Counter() for f in args.families}
    with tempfile.TemporaryDirectory(prefix="false-alarms-") as tmp:
        for family in args.families:
            for seed in args.seeds:
                for rope_name, rope in (("default", None), ("scaled", SCALED_ROPE[family])):
                    model = build_model(family, num_layers=args.layers, seed=seed, rope=rope)
                    base = Path(tmp) / f"{family}-{seed}-{rope_name}"
                    export_target(model, base / "target")
                    write_record(model, base / "data_0.ckpt")
                    write_capture(model, base / "capture.safetensors")
                    aligned = align(str(base / "data_0.ckpt"), str(base / "capture.safetensors"))
                    for layout in LAYOUTS:
                        export_drafter(model, base / layout, layout=layout, seed=seed)
                        for engine in ENGINES[layout]:
                            start = time.perf_counter()
                            log = None
                            if engine == "sglang":  # its launch as the server log states it (0.5.23 format)
                                log = str(sglang_log(base / "server.log", base / "target", base / layout,
                                                     accept_lens=(2.1, 2.6, 2.4, 2.9)))
                            report = diagnose(DoctorInputs(drafter=str(base / layout), target=str(base / "target"),
                                                           train=str(base / "data_0.ckpt"),
                                                           capture=str(base / "capture.safetensors"),
                                                           engine=None if log else engine, log=log),
                                              aligned=None if engine else aligned)
                            flagged = [f"{r.check}:{r.finding.code}" for r in report.flagged]
                            counts[family][report.level] += 1
                            codes[family].update(flagged)
                            print(f"{family:12} seed {seed} {rope_name:7} {layout:12} {engine or '-':7} "
                                  f"{report.level:8} {', '.join(flagged) or '-'} "
                                  f"({time.perf_counter() - start:.1f} s)", flush=True)
    print("\nfamily        cases  false PROBLEM  false ACTION  flagged codes")
    for family in args.families:
        c = counts[family]
        print(f"{family:12} {sum(c.values()):6} {c['PROBLEM']:14} {c['ACTION']:13}  "
              f"{', '.join(f'{k} x{v}' for k, v in codes[family].items()) or '-'}")
    total = Counter()
    for c in counts.values():
        total.update(c)
    print(f"{'all':12} {sum(total.values()):6} {total['PROBLEM']:14} {total['ACTION']:13}")
    return 1 if total["PROBLEM"] else 0


if __name__ == "__main__":
    sys.exit(main())
