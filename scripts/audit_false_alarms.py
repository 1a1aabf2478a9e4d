"""Count the training-data audit's false alarms on clean data: other seeds, other model families, both trainers' masks.

    python scripts/audit_false_alarms.py [--seeds 5] [--records 16]

For each model family of ``testing.tinymodels`` (Llama, Qwen3, DeepSeek-V3) and each seed, a target
(random weights, lm_head sharpened as in the tests) with a ChatML tokenizer answers chat prompts
itself (greedy, T 0.7 and T 1.0); the records are written the way SpecForge and speculators mask them,
thinking off and on (with reasoning), post-norm and raw finals; the served prompts ask for the same
mode. Every flagged finding (error or warning) of the template, data-origin and data-shape checks on
such clean data is a false alarm; the script prints them per family and the total.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagleforensics.checks.base import DoctorInputs  # noqa: E402
from eagleforensics.checks.registry import get_check  # noqa: E402
from eagleforensics.doctor import diagnose  # noqa: E402
from eagleforensics.testing import chat, tinymodels  # noqa: E402

ANSWER = 40


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--records", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    work = Path(tempfile.mkdtemp(prefix="eagleforensics-false-alarms-"))
    text = chat.english_text(60_000)
    checks = [get_check(n) for n in ("template", "data-origin", "data-shape")]
    total = runs = 0
    for family in tinymodels.FAMILIES:
        alarms: list[str] = []
        family_runs = tokens = 0
        status: dict[str, int] = {}
        for seed in range(args.seeds):
            model = chat.sharpen(tinymodels.build_model(family, num_layers=4, hidden=64, vocab=chat.VOCAB,
                                                        seed=100 + seed), 40.0)
            target = chat.write_target(work / f"{family}-{seed}" / "target", model)
            tok = chat.load(target)
            ids = tok.encode(text)
            head = tok.encode("<|im_start|>user\n")
            empty = len(tok.encode("<think>\n\n</think>\n\n"))  # SpecForge supervises it, speculators does not
            passages = [ids[(seed * 37 + i) * 150:(seed * 37 + i) * 150 + 24] for i in range(args.records)]
            for think in (False, True):
                tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n" + ("" if think else "<think>\n\n</think>\n\n"))
                prompts = [head + p + tail for p in passages]
                for temp in (0.0, 0.7, 1.0):
                    if think:  # the answer opens the think block itself, as Qwen3 does with thinking on
                        opn, cls = tok.token_id("<think>"), tok.token_id("</think>")
                        first = chat.generate(model, [p + [opn] for p in prompts], ANSWER // 2, temperature=temp,
                                              seed=seed)
                        rest = chat.generate(model, [p + [opn] + f + [cls] for p, f in zip(prompts, first)],
                                             ANSWER // 2, temperature=temp, seed=seed + 1)
                        answers = [[opn] + f + [cls] + r for f, r in zip(first, rest)]
                    else:
                        answers = chat.generate(model, prompts, ANSWER, temperature=temp, seed=seed)
                    for style in ("specforge", "speculators"):
                        for raw in (False, True):
                            d = work / f"{family}-{seed}" / f"{think}-{temp}-{style}-{raw}" / "rows_0-2000"
                            d.mkdir(parents=True, exist_ok=True)
                            eot = tok.token_id("<|im_end|>")
                            for i, (p, a) in enumerate(zip(prompts, answers)):
                                seq = p + a + [eot] + tok.encode("\n")
                                start = len(p) - (0 if think or style == "speculators" else empty)
                                mask = [0] * start + [1] * (len(seq) - start)
                                if style == "specforge":
                                    mask[-1] = 0  # SpecForge ends at the end of turn; speculators keeps the "\n"
                                torch.save(chat.specforge_record(model, seq, mask, raw_final=raw), d / f"data_{i}.ckpt")
                            served = d.parent / "served.jsonl"
                            served.write_text("".join(json.dumps(
                                {"messages": [{"role": "user", "content": tok.decode(p)}],
                                 "chat_template_kwargs": {"enable_thinking": think}}) + "\n" for p in passages[:4]))
                            report = diagnose(DoctorInputs(train=str(d.parent), target=str(target),
                                                           served_prompts=str(served), served_len=64),
                                              checks=checks, pipelines=())
                            family_runs += 1
                            for o in report.outcomes:
                                status[o.status] = status.get(o.status, 0) + 1
                            rows = next(o for o in report.outcomes if o.name == "data-origin").data
                            tokens += (rows.get("agreement") or {}).get("tokens", 0)
                            for r in report.findings:
                                if r.finding.severity in ("error", "warning"):
                                    alarms.append(f"seed {seed} think={think} T={temp} {style} raw={raw}: "
                                                  f"{r.finding.code}: {r.finding.message[:160]}")
        total += len(alarms)
        runs += family_runs
        print(f"{family:12s} {family_runs} clean datasets x {args.records} records ({tokens:,} scored answer tokens; "
              f"check rows {status}): {len(alarms)} false alarms", flush=True)
        for a in alarms[:10]:
            print("   ", a)
    print(f"total: {total} false alarms on {runs} clean datasets ({runs * args.records} records), "
          f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
