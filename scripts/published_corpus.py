"""Run ``doctor --target`` on every published config and shard index of the corpus, clean and planted.

Each entry of ``tests/fixtures/published`` (real configs and indexes of Llama, Mixtral, Qwen2/2.5/3 VL,
Qwen3.5, MiMo, Gemma-3, DeepSeek-V3/R1, Kimi-K2, gpt-oss, ...; the folder's README cites each) is laid out
as a partial download (config and index, no shard) and checked with no engine named: a PROBLEM or ACTION
other than the entry's documented true ones is a false alarm. Then every planted variant that fits the
entry (``testing.published.VARIANTS``) is checked with its engine, against the clean entry under the same
engine: the variant must add exactly its expected findings. Prints one line per case and the counts;
exit 1 on any false alarm or missed plant.

    python scripts/published_corpus.py [--entries NAME ...] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.doctor import diagnose
from eagleforensics.testing.published import VARIANTS, Entry, Variant, entries, materialise

LOUD = ("error", "warning")


def findings(target: Path, inputs: dict[str, Any]) -> tuple[list[tuple[str, str]], list[str]]:
    """(code, severity) of the error / warning findings of ``doctor --target``, and every message."""
    report = diagnose(DoctorInputs(target=str(target), **inputs))
    loud = sorted({(r.finding.code, r.finding.severity) for r in report.findings if r.finding.severity in LOUD})
    return loud, [r.finding.message for r in report.findings]


def run_case(entry: Entry, variant: Variant | None, tmp: Path) -> dict[str, Any]:
    """One row: the entry clean (``variant`` None) or with ``variant`` planted; ``ok`` when it is as expected."""
    clean_dir = materialise(entry, tmp / "clean")
    if variant is None:
        got, messages = findings(clean_dir, {})
        return {"entry": entry.name, "case": "clean", "expect": entry.clean, "got": got, "added": got,
                "ok": got == sorted(entry.clean), "messages": messages}
    d = materialise(entry, tmp / variant.name)
    inputs = variant.plant(d)
    base, _ = findings(clean_dir, inputs)
    got, messages = findings(d, inputs)
    added = sorted(set(got) - set(base))
    ok = added == sorted(variant.expect) and (not variant.message or not variant.expect or
                                              any(variant.message in m for m in messages))
    return {"entry": entry.name, "case": variant.name, "inputs": inputs, "expect": variant.expect, "base": base,
            "got": got, "added": added, "ok": ok, "messages": messages}


def cases(entry: Entry, tmp: Path) -> list[Variant]:
    """The variants that fit ``entry`` (decided on its materialised copy)."""
    d = materialise(entry, tmp / "probe")
    cfg = json.loads((d / "config.json").read_text())
    return [v for v in VARIANTS if v.fits(d, cfg)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", nargs="*", help="only these corpus entries")
    ap.add_argument("--json", action="store_true", help="one JSON object: every row and the counts")
    args = ap.parse_args(argv)
    rows = []
    for entry in entries():
        if args.entries and entry.name not in args.entries:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            for variant in [None, *cases(entry, Path(tmp))]:
                row = run_case(entry, variant, Path(tmp) / (variant.name if variant else "clean-run"))
                row["status"] = entry.status
                rows.append(row)
                if not args.json:
                    show = ", ".join(f"{c} {s}" for c, s in row["added"]) or "nothing"
                    print(f"{'ok ' if row['ok'] else 'BAD'} {entry.name:28s} {entry.status:13s} {row['case']:24s} {show}")
    clean = [r for r in rows if r["case"] == "clean"]
    planted = [r for r in rows if r["case"] != "clean"]
    counts = {"entries": len(clean), "published": sum(r["status"] == "published" for r in clean),
              "reconstructed": sum(r["status"] == "reconstructed" for r in clean),
              "clean_ok": sum(r["ok"] for r in clean), "false_alarms": sum(not r["ok"] for r in clean),
              "planted": len(planted), "planted_found": sum(r["ok"] and bool(r["expect"]) for r in planted),
              "near_misses_quiet": sum(r["ok"] and not r["expect"] for r in planted),
              "planted_wrong": sum(not r["ok"] for r in planted)}
    if args.json:
        print(json.dumps({"rows": [{k: v for k, v in r.items() if k != "messages"} for r in rows], "counts": counts},
                         indent=2))
    else:
        print(" ".join(f"{k}={v}" for k, v in counts.items()))
    return 0 if counts["false_alarms"] == 0 and counts["planted_wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
