"""Benchmark doctor, replay and align at the mission's own scale: a Kimi-K2.5-shaped case, run as a user runs it.

    python benchmarks/bench_doctor.py --tokens 512 --records 4                    # the 2-core VM
    python benchmarks/bench_doctor.py --tokens 2048 --records 8 --device cuda \\
        --replay-devices cpu cuda                                                  # a GPU host

Writes the case once (``benchmarks/kimicase.py``: SpecForge kimi-k25-eagle3 drafter, Kimi-K2 target as a partial
download with the full FP8 index, SpecForge ``.ckpt`` records, a 62-position capture; random weights of real
shapes), then runs each command as a subprocess (``python -m eagleforensics ...``, started from
``benchmarks/peakrss.py`` so the peak RSS is the command's own) and prints per run: wall seconds, peak host RSS,
peak GPU memory (nvidia-smi, sampled every 100 ms, with --device cuda), exit code, the rows that ran.

The roofline is measured in the same run: the read rate (this case's lm_head shard read from the page cache,
as the commands read it) and the float32 matmul rate (a [rows, 7168] x [7168, 8192] product on each device the
commands use). ``roofline = bytes needed / read rate + FLOPs needed / matmul rate`` where the bytes are the
target's lm_head once, the drafter's weights but its embedding (rows are gathered), the capture and the
records, and the FLOPs are the lm_head products (coverage's sampled rows, the audit's scored tokens, replay's
greedy tokens, drafter-baseline's record rows) plus the drafter's forward (fc per wiring; decoder layer and draft
lm_head per step and row; drafter-baseline's step 1, twice, on its 128 rows a record and 512 of the capture).
``ratio = roofline / wall``: 1.0 would be a run that does nothing but the necessary reads and products.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import kimicase  # noqa: E402

H, V = kimicase.H, kimicase.VOCAB


def read_rate(path: Path, limit: int = 4 << 30) -> float:
    """Bytes per second reading ``path`` (page cache warm: read once first) in 64 MiB reads."""
    buf = bytearray(64 << 20)
    view = memoryview(buf)

    def once() -> int:
        n = 0
        with path.open("rb", buffering=0) as fh:
            while n < limit:
                got = fh.readinto(view)
                if not got:
                    break
                n += got
        return n
    once()
    t0 = time.perf_counter()
    n = once()
    return n / (time.perf_counter() - t0)


def matmul_rate(device: str, rows: int = 2048) -> float:
    """float32 FLOP/s of a [rows, 7168] x [7168, 8192] product on ``device`` (best of 3 after a warm-up)."""
    a = torch.randn(rows, H, device=device)
    b = torch.randn(8192, H, device=device)
    best = float("inf")
    for i in range(4):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        (a @ b.T).sum().item()
        dt = time.perf_counter() - t0
        if i:
            best = min(best, dt)
    return 2 * rows * H * 8192 / best


class GpuPeak:
    """Peak GPU memory used (MiB) while a command runs, from nvidia-smi sampled every 100 ms."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5).stdout
                self.peak = max(self.peak, max(int(x) for x in out.split()))
            except (OSError, ValueError, subprocess.TimeoutExpired):
                return
            self._stop.wait(0.1)

    def __enter__(self) -> "GpuPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


PYCACHE: Path | None = None  # where the commands' bytecode is kept (set in main)


def run(label: str, args: list[str], gpu: bool, timeout: int, profile: Path | None = None) -> dict:
    """``python -m eagleforensics ARGS --json`` under peakrss.py: wall, peak RSS, GPU peak, exit code, JSON
    (``profile``: under cProfile too, its statistics written there)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    if PYCACHE is not None:  # an install has its bytecode compiled once; a read-only site-packages would not
        env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)  # keep it, and every command would pay ~2.7 s compiling torch
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # the GPU image sets it: no command kept any bytecode (3.9 s each)
    prof = ["-m", "cProfile", "-o", str(profile)] if profile else []
    cmd = [sys.executable, str(HERE / "peakrss.py"), sys.executable, *prof, "-m", "eagleforensics", *args, "--json"]
    probe = GpuPeak() if gpu else None
    t0 = time.perf_counter()
    if probe:
        probe.__enter__()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    finally:
        if probe:
            probe.__exit__()
    wall = time.perf_counter() - t0
    rss = next((int(line.split("=")[1]) for line in reversed(proc.stderr.splitlines())
                if line.startswith("peak_rss_kib=")), 0)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = None
    err = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("peak_rss_kib")]
    return {"label": label, "wall_s": round(wall, 2), "peak_rss_gib": round(rss / 2 ** 20, 2),
            "gpu_peak_gib": round(probe.peak / 1024, 2) if probe else None, "exit": proc.returncode,
            "json": doc, "stderr": err[-3:]}


class CompileWatch:
    """When the kernels' mark (``evidence.kernelcache``) appears, in seconds from now (0.0: there already;
    None: not yet), watched on a thread: a first align leaves their compile to a detached process."""

    def __init__(self) -> None:
        from eagleforensics.evidence import kernelcache

        self._stamp = kernelcache.stamp()  # the commands' own: same install, same Python, same CPU
        self.at: float | None = 0.0 if self._stamp.is_file() else None
        self._t0 = time.perf_counter()
        if self.at is None:
            threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self._stamp.is_file():
            time.sleep(0.25)
        self.at = time.perf_counter() - self._t0

    def wait(self, limit: float) -> float:
        """Wait (up to ``limit`` s) for the mark; returns the seconds waited."""
        t0 = time.perf_counter()
        while self.at is None and time.perf_counter() - t0 < limit:
            time.sleep(0.25)
        return time.perf_counter() - t0


def doctor_work(case: dict, tokens: int, records: int, doc: dict | None) -> dict:
    """Bytes and FLOPs the doctor's checks need on this case (see the module docstring)."""
    sup = tokens - tokens // 5 - 1  # supervised next tokens per record (the first 20% are the prompt)
    cov_rows = min(4096, records * sup) + min(tokens, 4096)
    audit_rows = records * min(256, sup)
    rep = (doc or {}).get("replay") or {}
    wirings = len(rep.get("wirings") or []) or 2
    steps = rep.get("steps") or 3
    q = kimicase.HEADS * kimicase.HEAD_DIM
    layer = 3 * q * 2 * H + H * q + 3 * kimicase.MLP * H
    draft = wirings * (tokens * 2 * (3 * H * H) + steps * tokens * 2 * (layer + kimicase.DRAFT_VOCAB * H))
    head = 2 * H * V
    drafter_bytes = 2 * (3 * H * H + layer + kimicase.DRAFT_VOCAB * H)
    cap_bytes = case["capture"].stat().st_size
    rec_bytes = sum(p.stat().st_size for p in case["train"].glob("*.ckpt"))
    # drafter-baseline: the step-1 forward (fc, layer, head) twice (own states, another row's) on its rows, and the
    # target's greedy tokens of the records' rows (the capture's are shared with coverage and replay)
    base_rec = min(records, 4) * min(tokens, 128)
    base_rows = base_rec + min(tokens, 512)
    draft += 2 * base_rows * 2 * (3 * H * H + layer + kimicase.DRAFT_VOCAB * H)
    return {"bytes": 2 * H * V + drafter_bytes + cap_bytes + rec_bytes,
            "lm_head_flops": head * (cov_rows + audit_rows + base_rec), "greedy_flops": head * tokens,
            "draft_flops": draft, "cov_rows": cov_rows + base_rec, "audit_rows": audit_rows, "wirings": wirings,
            "steps": steps}


def replay_summary(doc: dict | None) -> dict[str, tuple[float, list[float]]]:
    if not doc:
        return {}
    return {r["label"]: (r["accept_length"], r["acc"]) for r in doc.get("wirings", [])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/efkimi"))
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--records", type=int, default=4)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="doctor's --device")
    ap.add_argument("--replay-devices", nargs="*", default=["cpu"], choices=("cpu", "cuda"))
    ap.add_argument("--runs", nargs="+", default=["doctor", "replay", "align"], choices=("doctor", "replay", "align"))
    ap.add_argument("--served", nargs="*", default=[], metavar="ENGINE:VERSION",
                    help="also run doctor (and the last replay device's replay) with --engine ENGINE --engine-version "
                         "VERSION, e.g. sglang:0.5.23: the drafter judged as that engine serves it (SGLang swaps the "
                         "target's embedding in for the drafter's own)")
    ap.add_argument("--timeout", type=int, default=3000)
    ap.add_argument("--mark-wait", type=int, default=900, help="seconds the last align waits for the kernels' mark "
                    "(a machine without numba never marks it: keep this short there)")
    ap.add_argument("--profile", type=Path, default=None, help="also profile the doctor run (cProfile) into this file "
                    "and print its 30 costliest calls (cumulative)")
    ap.add_argument("--profile-replay", type=Path, default=None, help="the same for the last replay run")
    args = ap.parse_args()

    global PYCACHE
    PYCACHE = args.dir / "pycache"
    # an install compiles its packages' bytecode (pip does); an image that never did would charge each command's
    # imports to the first run measured: compiled here, into the commands' own bytecode folder
    import importlib.util

    pkgs = [str(Path(importlib.util.find_spec(m).origin).parent) for m in ("numpy", "numba", "llvmlite", "torch",
                                                                           "safetensors", "ml_dtypes")
            if importlib.util.find_spec(m) is not None]
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(ROOT / "eagleforensics"), *pkgs],
                   env={k: v for k, v in dict(os.environ, PYTHONPYCACHEPREFIX=str(PYCACHE)).items()
                        if k != "PYTHONDONTWRITEBYTECODE"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=600)
    print(f"# bytecode compiled as an install does, in {time.perf_counter() - t0:.0f} s")
    t0 = time.perf_counter()
    case = kimicase.write_case(args.dir, args.tokens, args.records)
    made = time.perf_counter() - t0
    cores = len(os.sched_getaffinity(0))
    gpu = torch.cuda.is_available()
    rates = {"read_Bps": read_rate(case["target"] / kimicase.shard_name(kimicase.SHARDS)),
             "cpu_flops": matmul_rate("cpu")}
    if gpu:
        rates["gpu_flops"] = matmul_rate("cuda")
        torch.cuda.empty_cache()
    print(f"# bench_doctor {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC: Kimi-K2.5 shape, T={args.tokens}, "
          f"{args.records} records, {cores} cores, torch {torch.__version__}"
          + (f", {torch.cuda.get_device_name()}" if gpu else "") + f"; case written/checked in {made:.0f} s")
    print(f"# machine: read {rates['read_Bps'] / 1e9:.1f} GB/s (page cache), float32 matmul "
          f"{rates['cpu_flops'] / 1e12:.2f} TFLOP/s CPU" + (f", {rates['gpu_flops'] / 1e12:.1f} TFLOP/s GPU" if gpu else ""))
    common = ["--target", str(case["target"])]
    results = []
    marked = CompileWatch()  # a fresh install's first align starts the kernels' compile in a detached process
    if "align" in args.runs:  # first, as a user's first command on a fresh install
        results.append(run("align (first)", ["align", str(case["record"]), str(case["capture"])], gpu, args.timeout))
        results[-1]["kernels"] = "cached already" if marked.at == 0.0 else "numpy path, compile started"
    if "doctor" in args.runs:
        results.append(run(f"doctor --device {args.device}", ["doctor", "--drafter", str(case["drafter"]), *common,
                                                                "--train", str(case["train"]), "--capture",
                                                                str(case["capture"]), "--device", args.device],
                           gpu, args.timeout, args.profile))
    for served in args.served:  # the same commands as the named engine serves the drafter
        engine, _, version = served.partition(":")
        flags = ["--engine", engine] + (["--engine-version", version] if version else [])
        if "doctor" in args.runs:
            results.append(run(f"doctor --device {args.device} {served}", [
                "doctor", "--drafter", str(case["drafter"]), *common, "--train", str(case["train"]), "--capture",
                str(case["capture"]), "--device", args.device, *flags], gpu, args.timeout))
        if "replay" in args.runs and args.replay_devices:
            dev = args.replay_devices[-1]
            results.append(run(f"replay --device {dev} {served}", [
                "replay", str(case["drafter"]), str(case["capture"]), *common, "--train", str(case["record"]),
                "--device", dev, *flags], gpu, args.timeout))
    if "replay" in args.runs:
        for i, dev in enumerate(args.replay_devices):
            last = i == len(args.replay_devices) - 1
            results.append(run(f"replay --device {dev}", ["replay", str(case["drafter"]), str(case["capture"]),
                                                           *common, "--train", str(case["record"]), "--device", dev],
                               gpu, args.timeout, args.profile_replay if last else None))
    if "align" in args.runs:
        waited = marked.wait(args.mark_wait)
        print(f"# kernels: {'in the cache before the first align' if marked.at == 0.0 else 'compiled in the background, marked %.0f s after the first align started' % marked.at if marked.at else 'NOT marked within the wait'}"
              + (f" (waited {waited:.0f} s more for the mark before the last align)" if waited > 0.5 else ""))
        results.append(run("align", ["align", str(case["record"]), str(case["capture"])], gpu, args.timeout))

    if cores <= 4:  # a small shared machine's load moves during a long run: the rates again after, the mean used
        after = {"read_Bps": read_rate(case["target"] / kimicase.shard_name(kimicase.SHARDS)),
                 "cpu_flops": matmul_rate("cpu")}
        print(f"# machine after the runs: read {after['read_Bps'] / 1e9:.1f} GB/s, float32 matmul "
              f"{after['cpu_flops'] / 1e12:.2f} TFLOP/s CPU (the roofline uses the mean of before and after)")
        rates.update({k: (rates[k] + after[k]) / 2 for k in after})
    print(f"{'run':<22} {'wall s':>8} {'RSS GiB':>8} {'GPU GiB':>8} {'exit':>5}  notes")
    for r in results:
        doc = r["json"] or {}
        note = ""
        if r["label"].startswith("doctor") and doc:
            ran = [c["name"] for c in doc.get("checks", []) if c["status"] != "not-run"]
            note = f"ran: {', '.join(ran)}"
            work = doctor_work(case, args.tokens, args.records, doc)
            gpu_side = args.device == "cuda" and gpu
            lm = work["lm_head_flops"] - (work["cov_rows"] * 2 * H * V if gpu_side else 0)
            dev_flops = work["draft_flops"] + work["greedy_flops"] + (work["cov_rows"] * 2 * H * V if gpu_side else 0)
            roof = (work["bytes"] / rates["read_Bps"] + lm / rates["cpu_flops"]
                    + dev_flops / (rates["gpu_flops"] if gpu_side else rates["cpu_flops"]))
            r["roofline_s"], r["ratio"] = round(roof, 2), round(roof / r["wall_s"], 3)
            r["work"] = work
            note += f"; roofline {roof:.1f} s, ratio {roof / r['wall_s']:.2f}"
            if doc.get("replay"):
                note += f"; replay's own {doc['replay'].get('seconds')} s"
            base = next((c for c in doc.get("checks", []) if c["name"] == "drafter-baseline"), None)
            if base:  # as served: which of the drafter's own parts the named engine dropped for the baseline
                note += (f"; drafter-baseline {base['status']}, served without "
                         f"{(base.get('data') or {}).get('served_without') or 'nothing'}")
            bad = [c["name"] for c in doc.get("checks", []) if c["status"] == "not-run" and c.get("reason")]
            if bad:
                note += f"; not run: {', '.join(bad)}"
        elif r["label"].startswith("replay") and doc:
            note = f"replay's own {doc.get('seconds')} s; " + "; ".join(
                f"{k}: L={v[0]:.3f}" for k, v in replay_summary(doc).items())
        elif r["label"].startswith("align") and doc:
            note = (f"kernels {r['kernels']}; " if "kernels" in r else "") + \
                f"{doc.get('level')}: {str(doc.get('verdict', ''))[:60]}"
        if r["stderr"] and r["exit"] not in (0, 1):
            note += " | " + " / ".join(r["stderr"])
        gpu_txt = "-" if r["gpu_peak_gib"] is None else f"{r['gpu_peak_gib']:.2f}"
        print(f"{r['label']:<22} {r['wall_s']:>8.1f} {r['peak_rss_gib']:>8.2f} {gpu_txt:>8} {r['exit']:>5}  {note}")
    reps = {r["label"]: r for r in results if r["label"].startswith("replay")}
    if "replay --device cpu" in reps and "replay --device cuda" in reps:
        a, b = (replay_summary(reps[k]["json"]) for k in ("replay --device cpu", "replay --device cuda"))
        worst = max((abs(a[k][0] - b[k][0]) for k in a if k in b), default=float("nan"))
        worst_acc = max((abs(x - y) for k in a if k in b for x, y in zip(a[k][1], b[k][1])), default=float("nan"))
        speed = reps["replay --device cpu"]["wall_s"] / reps["replay --device cuda"]["wall_s"]
        print(f"# replay cuda vs cpu: {speed:.1f}x faster (wall, {cores} cores); accept length differs by at most "
              f"{worst:.4f}, acc@k by at most {worst_acc:.4f} (tolerance 0.02 / 0.01: float order differs)")
    for prof in (args.profile, args.profile_replay):
        if prof and prof.exists():
            import pstats

            print(f"# {prof}")
            pstats.Stats(str(prof), stream=sys.stdout).sort_stats("cumulative").print_stats(30)
    out = {"tokens": args.tokens, "records": args.records, "cores": cores, "rates": rates,
           "runs": [{k: v for k, v in r.items() if k not in ("json",)} for r in results]}
    print("JSON " + json.dumps(out, default=str))


if __name__ == "__main__":
    main()
