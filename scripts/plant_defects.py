"""Plant each doctor defect, one at a time, into copies of data_samples/drafter and data_samples/target.

Writes OUT_DIR/<defect>/drafter and OUT_DIR/<defect>/target (plus a server log where the defect is
a launch argument), then runs the doctor on each and prints the matrix: the code it must find,
what it flagged (errors and warnings), and the doctor command that shows it. Exit 1 when a defect is
missed or something else is flagged. The defects are ``eagleforensics.testing.defects.DEFECTS``.

    python scripts/plant_defects.py [OUT_DIR] [--show NAME] [--example [--no-run]]

--example prints scripts/report.sh's doctor example instead: the random-embedding drafter with the samples'
training record and capture and a clean vLLM 0.14.0 server log (vLLM keeps a drafter's own
embedding from 0.11.1, so the init is served). With --no-run it writes the case and prints only the
doctor's arguments, one per line (scripts/report.sh renders the doctor report from them).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.doctor import diagnose
from eagleforensics.testing.defects import DEFECTS, SAMPLES, plant


def command(case) -> str:  # noqa: ANN001
    """The doctor command line for a planted case."""
    args = ["eagleforensics", "doctor", "--drafter", str(case.drafter), "--target", str(case.target)]
    for key, value in case.inputs.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(args)


def replay_phrase(drafter: Path, target: Path, inputs: dict) -> str:
    """Replay's answer for a case run with the samples' incident record and capture: the trained wiring's accept
    length (and the as-served one), or why replay refused the drafter."""
    extra = {k: v for k, v in inputs.items() if k not in ("capture", "train")}  # the incident record replaces them
    report = diagnose(DoctorInputs(drafter=str(drafter), target=str(target), train=str(SAMPLES / "record_layer_outputs.pt"),
                                   capture=str(SAMPLES / "capture.pt"), **extra))
    row = next(o for o in report.outcomes if o.name == "replay")
    if row.status == "not-run":
        return row.reason
    rep = report.replay
    trained = next((w for w in rep["wirings"] if w["label"] == rep["trained"] and not w.get("served_without")), None)
    served = next((w for w in rep["wirings"] if w.get("served_without")), None)
    text = f"{trained['accept_length']:.2f}" if trained else "-"
    if served:
        text += f", as served without {', '.join(served['served_without'])} {served['accept_length']:.2f}"
    return text


def example(out: Path, run: bool = True) -> int:
    """report.sh's doctor example: a drafter with a random embedding, served by vLLM, with a record and a capture."""
    from eagleforensics.testing.defects import vllm_log

    defect = next(d for d in DEFECTS if d.name == "embedding-random")
    case = plant(defect, out)
    spec = {"method": "eagle3", "model": str(case.drafter), "num_speculative_tokens": 3}
    log = vllm_log(case.drafter.parent / "server.log", "0.14.0", case.target, spec, max_model_len=512)
    import os

    inputs = {k: os.path.relpath(v) for k, v in dict(
        drafter=case.drafter, target=case.target, train=SAMPLES / "record_layer_outputs.pt",
        capture=SAMPLES / "capture.pt", log=log).items()}
    if not run:
        print("\n".join(x for k, v in inputs.items() for x in (f"--{k}", v)))
        return 0
    print("$ " + shlex.join(["eagleforensics", "doctor"] + [x for k, v in inputs.items()
                                                             for x in (f"--{k}", v)]))
    report = diagnose(DoctorInputs(**inputs))
    print(report.to_text())
    return report.exit_code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="planted", help="where to write the cases (default ./planted)")
    ap.add_argument("--show", action="append", default=[], help="print the doctor's full output for this defect")
    ap.add_argument("--example", action="store_true", help="print report.sh's doctor example run")
    ap.add_argument("--no-run", action="store_true", help="with --example: write the case, print the doctor's arguments")
    ap.add_argument("--replay", action="store_true",
                    help="also run the doctor with the samples' record and capture: replay's accept length per case")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.example:
        return example(out, run=not args.no_run)
    bad = 0
    print(f"{'defect':24} {'must find':22} {'level':8} flagged" + ("  | replay (clean: trained p3,p7,p10)" if args.replay
                                                                else ""))
    if args.replay:
        print(f"{'(clean sample)':24} {'-':22} {'-':8} -  | {replay_phrase(SAMPLES / 'drafter', SAMPLES / 'target', {})}")
    for defect in DEFECTS:
        case = plant(defect, out)
        report = diagnose(DoctorInputs(drafter=str(case.drafter), target=str(case.target), **case.inputs))
        flagged = [r.finding.code for r in report.flagged]
        ok = flagged == [defect.code]
        bad += not ok
        extra = f"  | {replay_phrase(case.drafter, case.target, case.inputs)}" if args.replay else ""
        print(f"{defect.name:24} {defect.code:22} {report.level:8} {', '.join(flagged) or '-'}"
              f"{'' if ok else '  <-- WRONG'}{extra}")
        if defect.name in args.show:
            print("  $ " + command(case))
            print("\n".join("  " + line for line in report.to_text().splitlines()))
    print(f"\n{len(DEFECTS) - bad} of {len(DEFECTS)} defects found with their code and nothing else flagged")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
