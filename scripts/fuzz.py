"""Fuzz the loaders and ``align`` with mutated copies of data_samples/ for a fixed time.

    python scripts/fuzz.py [--minutes 5] [--out fuzz-out] [--timeout 30]

Hypothesis generates the mutations (tests/mutations.py: bit flips, boundary bytes,
truncations, dropped or inserted bytes, corrupted gzip members) with a long budget and no
shrinking. Half of the inputs are other kinds the CLI reads (tests/fuzzkinds.py): TensorRT-LLM
YAML and draft config.json with spliced aliases and deep nesting, draft directories whose
model.safetensors is damaged or a FIFO, SGLang/vLLM logs plain and gzipped, a .ckpt.gz whose
inner torch zip stores its records deflated (an archive in an archive), and .npz files. Every input ends as one of:

* ``result``      alignment ran (its placements are checked against the clean run);
* ``clean-error`` a one-line ForensicsError, what the CLI turns into exit code 2;
* ``failure``     any other exception (a traceback for the user);
* ``wrong``       a slot placed confidently at a position the clean run does not give it;
* ``relabelled``  the same, but the mutated capture is a valid sweep of another N (entries of an
                  HF list dropped): right about the file as it is, so counted apart, not a failure;
* ``hang``/``crash`` the worker stopped answering for ``--timeout`` s or died (SIGBUS, ...);
* ``memory``      the worker's peak resident memory passed ``--max-rss-mib`` (1 GiB) during this input
                  (every input is under 1 MB); the worker is then replaced, so each input is judged alone.
* ``warning``     a ``RuntimeWarning`` (numpy's overflow, invalid value, ...) while the input was read
                  or aligned: the CLI would print it under its answer or its one-line error.

The kinds of issue 19 (tests/fuzzkinds.py ``ISSUE_19_KINDS``: drafter and target directories,
report pages for ``read_report``, safetensors/npy headers claiming other layouts, fingerprints)
are drawn as often as the others. The summary ends with the peak resident memory of any worker.

Inputs run in a worker process so that hangs and crashes are counted, saved under
``--out`` and the run goes on. Prints the inputs tried and the failures found, grouped by
signature, and exits 1 if there was any failure.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BAD = ("failure", "wrong", "hang", "crash", "memory", "warning")
MIB = 1024 * 1024


def worker(deadline: float, log: Path, scratch: Path, timeout: float, seed: int, max_rss: int) -> None:
    """Run cases until ``deadline``; append one JSON line per input to ``log``.

    Stops after an input that took the peak resident memory past ``max_rss`` bytes (the driver
    starts a fresh worker: the high-water mark only rises). The address space is capped at
    8 GiB, so a runaway allocation fails in this worker instead of exhausting the machine.
    """
    import faulthandler
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_AS, (8 * 1024 * MIB, resource.RLIM_INFINITY))
    except (ValueError, OSError):  # pragma: no cover - not allowed here
        pass

    import torch
    from hypothesis import HealthCheck, Phase, given, seed as hseed, settings

    from hypothesis import strategies as st

    from tests import fuzzkinds
    from tests.mutations import baseline, cases, relabelled, run_case, wrong_placements

    torch.set_num_threads(1)
    current = scratch / "current.json"
    memory_hit: list[int] = []

    class Stop(Exception):
        pass

    @hseed(seed)
    @settings(max_examples=10**9, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(cases(max_edits=4), fuzzkinds.kind_cases()))
    def one(case) -> None:  # type: ignore[no-untyped-def]
        if time.time() > deadline or memory_hit:
            raise Stop
        current.write_text(json.dumps({"case": repr(case)[:2000], "file": f"mutated_{case.target}"}))
        faulthandler.dump_traceback_later(timeout, exit=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            if isinstance(case, fuzzkinds.KindCase):  # configs, draft directories, logs, nested archives
                kind, detail, sig = fuzzkinds.run(case, scratch / "in")
                out = None
            else:
                out = run_case(case, scratch / "in")
                kind, detail, sig = out.kind, out.detail, out.signature
        faulthandler.cancel_dump_traceback_later()
        if kind == "result" and out is not None:
            clean = baseline(case.train, case.capture, str(scratch / "clean"))
            wrong = wrong_placements(out.result, clean)
            if wrong and relabelled(out.result, clean):
                kind, detail = "relabelled", f"N={out.result.num_layers}: " + "; ".join(wrong)
            elif wrong:
                kind, detail, sig = "wrong", "; ".join(wrong), f"confident wrong placement ({case.side} side)"
        # after the placements are judged, so a warning never hides a wrong answer
        noisy = [w for w in caught if issubclass(w.category, RuntimeWarning)]
        if noisy and kind not in BAD:
            w = noisy[0]
            kind, detail = "warning", f"{kind}, then {w.category.__name__}: {w.message}"
            sig = f"{w.category.__name__} at {Path(w.filename).name}:{w.lineno}"
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if peak > max_rss and kind not in BAD:
            kind, detail, sig = "memory", f"peak resident memory {peak / MIB:.0f} MiB", \
                f"memory ({getattr(case, 'kind', 'sample')})"
            memory_hit.append(peak)
        entry = {"kind": kind, "detail": detail, "signature": sig, "case": repr(case)[:2000],
                 "input": getattr(case, "kind", "sample"), "peak_rss": peak}
        if kind in BAD:
            keep = scratch / "saved" / f"{int(time.time() * 1e6)}_{case.target}"
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(scratch / "in" / f"mutated_{case.target}", keep)
            entry["saved"] = str(keep)
        with log.open("a") as fh:
            fh.write(json.dumps(entry) + "\n")
        current.unlink()

    try:
        one()
    except Stop:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds one input may take before it counts as a hang")
    ap.add_argument("--out", type=Path, default=Path("fuzz-out"), help="where failing inputs are saved")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-rss-mib", type=float, default=1024.0, help="peak resident memory an input may take")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--scratch", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.deadline, args.scratch / "log.jsonl", args.scratch, args.timeout, args.seed,
               int(args.max_rss_mib * MIB))
        return 0

    start = time.time()
    deadline = start + 60 * args.minutes
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="eagleforensics-fuzz-"))
    log = scratch / "log.jsonl"
    restarts, seed = 0, args.seed
    while time.time() < deadline - 1:
        cmd = [sys.executable, __file__, "--worker", "--deadline", str(deadline), "--scratch", str(scratch),
               "--timeout", str(args.timeout), "--seed", str(seed), "--max-rss-mib", str(args.max_rss_mib)]
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONHASHSEED": "0"})
        current = scratch / "current.json"
        if current.exists():  # the worker died or was stopped by the watchdog mid-input
            info = json.loads(current.read_text())
            kind = "hang" if "Timeout" in proc.stderr else "crash"
            keep = args.out / f"{kind}_{restarts}_{info['file']}"
            src = scratch / "in" / info["file"]
            if src.exists():
                shutil.copyfile(src, keep)
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            with log.open("a") as fh:
                fh.write(json.dumps({"kind": kind, "detail": f"rc={proc.returncode}: {tail[:300]}",
                                     "signature": f"{kind} rc={proc.returncode}", "case": info["case"],
                                     "saved": str(keep)}) + "\n")
            current.unlink()
        elif proc.returncode != 0:
            print(f"worker exited {proc.returncode}: {proc.stderr.strip()[-2000:]}", file=sys.stderr)
            break
        restarts += 1
        seed += 1
    entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    for e in entries:  # move saved inputs out of the scratch folder
        if e.get("saved", "").startswith(str(scratch)):
            dst = args.out / Path(e["saved"]).name
            shutil.copyfile(e["saved"], dst)
            e["saved"] = str(dst)
    (args.out / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    shutil.rmtree(scratch, ignore_errors=True)

    kinds = collections.Counter(e["kind"] for e in entries)
    minutes = (time.time() - start) / 60
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the largest worker's peak
    print(f"fuzz: {len(entries)} inputs tried in {minutes:.1f} min ({restarts} worker runs); "
          f"peak resident memory of any worker {children / MIB:.0f} MiB")
    for k in ("result", "clean-error", "relabelled", *BAD):
        print(f"  {k:<12} {kinds.get(k, 0)}")
    per_input = collections.Counter(e.get("input", "sample") for e in entries)
    print("inputs per kind: " + ", ".join(f"{k} {n}" for k, n in sorted(per_input.items())))
    errors = collections.Counter(e["detail"].split(": ", 1)[-1].split(" (")[0][:70]
                                 for e in entries if e["kind"] == "clean-error")
    print("most common clean errors:")
    for msg, n in errors.most_common(8):
        print(f"  {n:6d}  {msg}")
    bad = [e for e in entries if e["kind"] in BAD]
    groups: dict[str, list[dict]] = collections.defaultdict(list)
    for e in bad:
        groups[e["signature"]].append(e)
    print(f"failures found: {len(bad)} ({len(groups)} distinct)")
    for sig, items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(items):5d}  {sig}: {items[0]['detail'][:160]}")
        print(f"         e.g. {items[0]['case'][:200]} -> {items[0].get('saved', '-')}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
