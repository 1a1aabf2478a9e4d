"""Benchmark ``eagleforensics align`` as a user runs it: one process per run, against ``cat`` of the same files.

    python benchmarks/bench_align.py                       # Kimi-K2 shape, .ckpt and safetensors records
    python benchmarks/bench_align.py --shapes kimi-k2 llama-8b --modes cli numpy torch-loop
    python benchmarks/bench_align.py --device cuda         # adds the GPU mode (and the host-to-device copy rate)
    python benchmarks/bench_align.py --dir /tmp/efbench --keep --repeat 7   # reuse the synthetic files

For each shape (Kimi-K2: N=61, 62 raw positions of H=7168 plus the post-norm final, bf16) the
script writes synthetic sweeps at T=512 and T=2048 (``synth.py``) and the training record as
SpecForge's ``.ckpt`` and as safetensors. Then, in one run:

* ``cat``: the page-cache read rate of the same files (capture and record: what align reads),
  ``cat CAPTURE RECORD > /dev/null`` after a warm read, best of ``--repeat``;
* ``align``: ``python -m eagleforensics align RECORD CAPTURE --json``, each run a fresh process,
  T=512 and T=2048 interleaved, ``--repeat`` times each; best and median wall time, CPU time
  (user + sys) and peak RSS (``peakrss.py``);
* the marginal throughput: (input bytes at T=2048 - at T=512) / (wall at 2048 - at 512), so
  start-up cancels, and its ratio to the ``cat`` rate (target >= 0.45x from the medians), from the best runs, from
  the medians, and from the repetitions as pairs (each T=512 run and the T=2048 run right after it:
  the median of their differences, with its quartiles, the steadiest of the three); peak RSS over the
  capture at T=2048 (target <= 0.3x); align's wall at T=512 with the .ckpt record (target <= 1 s);
  whether torch was imported (``-X importtime``, one extra run per record);
* the verdict: align must place the three aux slots and the post-norm final where they were drawn from;
* start-up: ``eagleforensics --help`` and ``align`` on the samples (safetensors pair, target < 0.3 s;
  the SpecForge .ckpt sample with the .pt capture).

``--modes`` adds other ways of scoring as columns: ``numpy`` (``EAGLEFORENSICS_FUSED=0``),
``fused`` (kernels forced), ``torch-loop`` (``torchloop.py``, a plain torch loop: the baseline),
``gpu`` (``--device cuda``). ``--inproc`` also times align inside this process after a warm-up.
``--fingerprint`` fingerprints the large sweep and aligns against it. Files go to a temporary
folder (or ``--dir``), checked against free disk space first, and are deleted unless ``--keep``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from synth import LASTS, SHAPES, Sweep, write_sweep  # noqa: E402

CLI = [sys.executable, "-m", "eagleforensics"]
FP_CLI = [sys.executable, "-c", "from eagleforensics.cli.fingerprint import fingerprint; fingerprint()"]
PEAKRSS = Path(__file__).resolve().parent / "peakrss.py"
TORCH_LOOP = [sys.executable, str(Path(__file__).resolve().parent / "torchloop.py")]
MODES = {  # name -> (environment, --device); "torch-loop" runs torchloop.py instead of align
    "cli": ({}, "cpu"),
    "numpy": ({"EAGLEFORENSICS_FUSED": "0"}, "cpu"),
    "fused": ({"EAGLEFORENSICS_FUSED": "1"}, "cpu"),
    "gpu": ({}, "cuda"),
    "torch-loop": ({}, "cpu"),
}
RECORDS = ("ckpt", "safetensors", "pt")
SAMPLES = {
    "safetensors": ["data_samples/record_layer_outputs.safetensors", "data_samples/capture_sweep.safetensors"],
    "ckpt": ["data_samples/data_0.ckpt", "data_samples/capture.pt"],
}
TARGETS = {"ratio": 0.45, "rss": 0.3, "t512_ckpt": 1.0, "sample": 0.3}  # ratio: the median marginal / cat


def run(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """One child process: wall seconds, exit code, its own peak RSS (bytes, via peakrss.py), CPU seconds, stdout."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(PEAKRSS), *cmd], stdout=subprocess.PIPE, stderr=err, cwd=ROOT,
                                env={**os.environ, **(env or {})})
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        code = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode()
        if code not in (0, 1):
            raise SystemExit(f"{' '.join(cmd)} failed ({code}): {text[-2000:]}")
        peak_kib = int(text.rstrip().rsplit("peak_rss_kib=", 1)[1])
    return {"wall": wall, "rc": code, "rss": peak_kib * 1024, "out": out.decode(),
            "cpu": usage.ru_utime + usage.ru_stime}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [r["wall"] for r in runs]
    return {"wall": min(walls), "median": statistics.median(walls), "walls": walls, "rc": runs[0]["rc"],
            "rss": max(r["rss"] for r in runs), "cpu": min(r["cpu"] for r in runs), "out": runs[0]["out"]}


def kernels_compiled(limit_s: float = 900) -> float:
    """Compile the kernels into numba's cache and mark it, as the detached process of a first run does
    (``fused.compile_into_cache``), and wait for the mark: timed runs then load the cached code.
    Returns the seconds it took (0 when the cache was marked already)."""
    check = [sys.executable, "-c", "from eagleforensics.evidence import kernelcache; "
             "raise SystemExit(0 if kernelcache.ready() else 1)"]
    t0 = time.perf_counter()
    if subprocess.run(check, cwd=ROOT).returncode == 0:
        return 0.0
    subprocess.run([sys.executable, "-c", "from eagleforensics.evidence.fused import compile_into_cache; "
                    "compile_into_cache()"], cwd=ROOT, check=True, timeout=limit_s)
    while subprocess.run(check, cwd=ROOT).returncode:  # another process held the lock: it is compiling
        if time.perf_counter() - t0 > limit_s:
            raise SystemExit("the kernels were not compiled within the limit")
        time.sleep(2)
    return time.perf_counter() - t0


def cat_rate(paths: list[Path], repeat: int) -> tuple[float, float]:
    """(bytes/s, best seconds) of ``cat PATHS > /dev/null`` after a warm read."""
    cmd = "cat " + " ".join(f"'{p}'" for p in paths) + " > /dev/null"
    subprocess.run(cmd, shell=True, check=True)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, shell=True, check=True)
        times.append(time.perf_counter() - t0)
    return sum(p.stat().st_size for p in paths) / min(times), min(times)


def readahead(paths: list[Path]) -> None:
    """Put ``paths`` in the page cache as a first read after eviction leaves them: drop their pages
    (``posix_fadvise(DONTNEED)``, these files only) and read them back, so readahead builds the cache.

    The cache's state changes how fast a file is read from there: ``cat`` read the 1.85 GB sweep at
    25-27 GB/s freshly written or dropped and read back, and at 10-14 GB/s once a test-suite run had
    churned memory while it stayed cached (kernel 6.18 here). Same-run ratios to ``cat`` depend on it."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)


def placed_right(out: str, sweep: Sweep) -> bool | None:
    doc = json.loads(out)
    if "mapping" not in doc:  # the torch loop: sums only, no verdict
        return None
    got = [(m["position"], m["post_norm"], m["confident"]) for m in doc["mapping"]]
    want = [(p, False, True) for p in sweep.aux_positions] + [(sweep.num_layers, True, True)]
    return got == want


def imports_torch(cmd: list[str], env: dict[str, str]) -> bool:
    """Whether the command imports torch (one extra run under ``-X importtime``)."""
    res = subprocess.run([sys.executable, "-X", "importtime", *cmd[1:]], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, **env})
    return any(line.rstrip().endswith((" torch", "| torch")) for line in res.stderr.splitlines())


def command(mode: str, record: Path, capture: Path, sweep: Sweep) -> list[str]:
    if mode == "torch-loop":
        return [*TORCH_LOOP, str(capture), str(sweep.record_safetensors)]
    return [*CLI, "align", str(record), str(capture), "--json", "--device", MODES[mode][1]]


def inproc_seconds(record: Path, capture: Path, device: str, repeat: int) -> float:
    """Best wall time of ``align`` called in this process (imports and CUDA start-up already paid)."""
    from eagleforensics.alignment import align

    align(record, capture, device=device)  # warm: CUDA context, kernels, page cache
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        align(record, capture, device=device)
        times.append(time.perf_counter() - t0)
    return min(times)


def h2d_rate(nbytes: int = 1 << 30) -> dict[str, float]:
    """Host-to-device copy rate (bytes/s), pinned and pageable sources, best of 5."""
    import torch

    out: dict[str, float] = {}
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    for kind in ("pinned", "pageable"):
        host = torch.empty(nbytes, dtype=torch.uint8)
        host = host.pin_memory() if kind == "pinned" else host
        host.fill_(1)
        times = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dev.copy_(host, non_blocking=(kind == "pinned"))
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out[kind] = nbytes / min(times)
    return out


def startup(repeat: int) -> dict[str, Any]:
    """``--help`` and align on the samples, each a fresh process: best and median of ``repeat`` (after one untimed run)."""
    run([*CLI, "--help"])
    out = {"help": summary([run([*CLI, "--help"]) for _ in range(repeat)])}
    for name, files in SAMPLES.items():
        run([*CLI, "align", *files])
        out[name] = summary([run([*CLI, "align", *files]) for _ in range(repeat)])
        out[name]["torch"] = imports_torch([*CLI, "align", *files], {})
    return {k: {kk: vv for kk, vv in v.items() if kk != "out"} for k, v in out.items()}


def bench_shape(shape: str, args: argparse.Namespace, folder: Path, columns: list[tuple[str, str]],
                last: str = "postnorm") -> dict[str, Any]:
    small_t, large_t = args.tokens
    sweeps = {t: write_sweep(folder, shape, t, last=last) for t in args.tokens}
    res: dict[str, Any] = {"columns": {}, "bytes": {}, "cat": {}, "cache": args.cache, "last": last}
    if args.cache == "readahead":
        readahead(sorted({f for t in args.tokens for f in [sweeps[t].capture,
                                                              *(sweeps[t].record_as(r) for _, r in columns)]}))
    for rec in sorted({r for _, r in columns}):
        for t in args.tokens:
            files = [sweeps[t].capture, sweeps[t].record_as(rec)]
            res["bytes"][f"{rec}/{t}"] = sum(f.stat().st_size for f in files)
            rate, secs = cat_rate(files, args.repeat)
            res["cat"][f"{rec}/{t}"] = {"rate": rate, "wall": secs}
    for mode, rec in columns:
        env = MODES[mode][0]
        sw = sweeps[small_t]  # warm-up, not timed: numba's cache filled (a changed kernel compiles), files in the page cache
        run(command(mode, sw.record_as(rec), sw.capture, sw), env)
        runs: dict[int, list[dict[str, Any]]] = {t: [] for t in args.tokens}
        for _ in range(args.repeat):  # interleaved, so a slow spell of the machine hits both sizes
            for t in args.tokens:
                sw = sweeps[t]
                runs[t].append(run(command(mode, sw.record_as(rec), sw.capture, sw), env))
        col: dict[str, Any] = {"by_tokens": {}}
        for t in args.tokens:
            s = summary(runs[t])
            s["placed_right"] = placed_right(s.pop("out"), sweeps[t])
            col["by_tokens"][str(t)] = s
            if mode == "gpu" or args.inproc and mode != "torch-loop":
                os.environ.update(env)
                from eagleforensics.evidence import fused

                fused.AVAILABLE = mode != "numpy" and importlib.util.find_spec("numba") is not None
                fused.MIN_BYTES = 0 if mode in ("fused", "gpu") else fused.MIN_BYTES
                s["inproc_s"] = inproc_seconds(sweeps[t].record_as(rec), sweeps[t].capture, MODES[mode][1],
                                               args.repeat)
        a, b = col["by_tokens"][str(small_t)], col["by_tokens"][str(large_t)]
        extra = res["bytes"][f"{rec}/{large_t}"] - res["bytes"][f"{rec}/{small_t}"]
        cat = max(res["cat"][f"{rec}/{t}"]["rate"] for t in args.tokens)  # the faster cat: the harder bar
        col["marginal"] = extra / max(b["wall"] - a["wall"], 1e-9)
        col["marginal_median"] = extra / max(b["median"] - a["median"], 1e-9)
        col["marginal_cpu"] = extra / max(b["cpu"] - a["cpu"], 1e-9)
        # each repetition ran T=small then T=large back to back: their difference is one paired sample, and
        # its median (with the quartiles) shrugs off a slow spell that only one size's best or median met
        pairs = sorted(y - x for x, y in zip(a["walls"], b["walls"]))
        col["paired_s"] = [pairs[len(pairs) // 4], statistics.median(pairs), pairs[3 * len(pairs) // 4]]
        col["ratio_paired"] = [extra / max(d, 1e-9) / cat for d in reversed(col["paired_s"])]  # low, mid, high
        col["measurable"] = b["wall"] - a["wall"] > 0.02
        col["ratio"], col["ratio_median"] = col["marginal"] / cat, col["marginal_median"] / cat
        col["cat_rate"] = cat
        col["rss_over_capture"] = b["rss"] / sweeps[large_t].capture_bytes
        col["right"] = None if a["placed_right"] is None else bool(a["placed_right"] and b["placed_right"])
        if "inproc_s" in b:
            col["inproc_marginal"] = extra / max(b["inproc_s"] - a["inproc_s"], 1e-9)
        if mode != "torch-loop":
            sw = sweeps[small_t]
            col["torch"] = imports_torch(command(mode, sw.record_as(rec), sw.capture, sw), env)
        res["columns"][f"{mode}/{rec}"] = col
    if args.fingerprint:
        sw = sweeps[large_t]
        fp = folder / f"{shape}-T{large_t}.fp.json"
        made = run([*FP_CLI, str(sw.capture), "-o", str(fp)])
        est = run([*CLI, "align", str(sw.record_safetensors), str(fp), "--json"])
        res["fingerprint"] = {"write_s": made["wall"], "bytes": fp.stat().st_size, "align_s": est["wall"],
                              "right": placed_right(est["out"], sw)}
    res["capture_bytes"] = {str(t): sweeps[t].capture_bytes for t in args.tokens}
    return res


def print_shape(key: str, r: dict[str, Any], tokens: list[int]) -> None:
    shape = key.split("/")[0]
    n, h = SHAPES[shape]
    small, large = (str(t) for t in tokens)
    cols = list(r["columns"])
    recs = sorted({c.split("/")[1] for c in cols})
    cap = r["capture_bytes"]
    ends = "the post-norm final" if r.get("last", "postnorm") == "postnorm" else "no post-norm final (raw last)"
    print(f"\n{key} (N={n}: {n + 1} raw positions + {ends}, H={h}, bf16): capture "
          f"{cap[small] / 1e9:.2f} / {cap[large] / 1e9:.2f} GB at T={small} / {large}; record "
          + ", ".join(f".{rec} {(r['bytes'][f'{rec}/{small}'] - cap[small]) / 1e6:.0f} / "
                      f"{(r['bytes'][f'{rec}/{large}'] - cap[large]) / 1e6:.0f} MB" for rec in recs)
          + f"; page cache {r.get('cache', 'as-is')}")
    w = 26
    heads = [f"cat (+.{rec})" for rec in recs] + [f"{c.split('/')[0]} .{c.split('/')[1]}" for c in cols]
    print(f"  {'':<34}" + "".join(f"{x:>{w}}" for x in heads))

    def line(label: str, cats: list[str], cells: list[str]) -> None:
        print(f"  {label:<34}" + "".join(f"{x:>{w}}" for x in cats + cells))

    for t in (small, large):
        line(f"T={t}: wall s best / median", [f"{r['cat'][f'{rec}/{t}']['wall']:.3f}" for rec in recs],
             [f"{r['columns'][c]['by_tokens'][t]['wall']:.3f} / {r['columns'][c]['by_tokens'][t]['median']:.3f}"
              for c in cols])
        line(f"T={t}: CPU s", [""] * len(recs), [f"{r['columns'][c]['by_tokens'][t]['cpu']:.2f}" for c in cols])
    line("marginal GB/s best (median)", [f"{r['cat'][f'{rec}/{large}']['rate'] / 1e9:.2f}" for rec in recs],
         [f"{r['columns'][c]['marginal'] / 1e9:.2f} ({r['columns'][c]['marginal_median'] / 1e9:.2f})"
          if r["columns"][c]["measurable"] else "not measurable" for c in cols])
    line(f"  / cat (target >= {TARGETS['ratio']}x)", ["1.00x"] * len(recs),
         [f"{r['columns'][c]['ratio']:.2f}x ({r['columns'][c]['ratio_median']:.2f}x)"
          if r["columns"][c]["measurable"] else "" for c in cols])
    line("  / cat, paired runs: median (IQR)", [""] * len(recs),
         [f"{r['columns'][c]['ratio_paired'][1]:.2f}x ({r['columns'][c]['ratio_paired'][0]:.2f}-"
          f"{r['columns'][c]['ratio_paired'][2]:.2f}x)" if r["columns"][c]["measurable"] else "" for c in cols])
    line("  per CPU-second, GB", [""] * len(recs), [f"{r['columns'][c]['marginal_cpu'] / 1e9:.2f}" for c in cols])
    if any("inproc_marginal" in r["columns"][c] for c in cols):
        line("  in-process marginal / cat", [""] * len(recs), [
            f"{r['columns'][c]['inproc_marginal'] / r['columns'][c]['cat_rate']:.2f}x"
            if "inproc_marginal" in r["columns"][c] else "" for c in cols])
    line(f"peak RSS / capture T={large} (<= {TARGETS['rss']}x)", [""] * len(recs), [
        f"{r['columns'][c]['rss_over_capture']:.2f}x ({r['columns'][c]['by_tokens'][large]['rss'] / 2**20:.0f} MiB)"
        for c in cols])
    line("torch imported", [""] * len(recs), ["-" if "torch" not in r["columns"][c] else
                                              ("YES" if r["columns"][c]["torch"] else "no") for c in cols])
    line("verdict", [""] * len(recs), ["-" if r["columns"][c]["right"] is None else
                                       "right" if r["columns"][c]["right"] else "WRONG" for c in cols])
    if "fingerprint" in r:
        f = r["fingerprint"]
        print(f"  fingerprint of T={large}: {f['write_s']:.2f} s, {f['bytes'] / 1e6:.1f} MB; align on it "
              f"{f['align_s']:.2f} s, verdict {'right' if f['right'] else 'WRONG'}")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["kimi-k2"], choices=list(SHAPES))
    ap.add_argument("--tokens", nargs=2, type=int, default=[512, 2048], metavar=("T_SMALL", "T_LARGE"))
    ap.add_argument("--records", nargs="+", default=["ckpt", "safetensors"], choices=RECORDS,
                    help="which copies of the training record align reads (each a column)")
    ap.add_argument("--modes", nargs="+", default=["cli"], choices=list(MODES),
                    help="ways of scoring, each a column: cli (align as installed: the kernels for large "
                         "captures), numpy, fused (kernels forced), torch-loop (a plain torch loop), gpu")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"), help="cuda: adds the gpu mode")
    ap.add_argument("--last", nargs="+", default=list(LASTS), choices=LASTS,
                    help="what each sweep ends with: postnorm (the post-norm final, as the capture helper writes) "
                         "or raw (no post-norm state: align fits the final's gain), each a table")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="where the synthetic files go (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic files")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--inproc", action="store_true", help="also time align inside this process after a warm-up")
    ap.add_argument("--fingerprint", action="store_true", help="also fingerprint the large sweep and align on it")
    ap.add_argument("--no-startup", action="store_true", help="skip --help and the samples")
    ap.add_argument("--cache", default="as-is", choices=("as-is", "readahead"),
                    help="readahead: drop the sweep's files from the page cache and read them back first "
                         "(from the slow state, cat then read them 2-2.5x faster here: see readahead())")
    args = ap.parse_args()
    modes = list(dict.fromkeys(args.modes + (["gpu"] if args.device != "cpu" else [])))
    columns = [(m, "safetensors" if m == "torch-loop" else r) for m in modes for r in args.records]
    columns = list(dict.fromkeys(columns))

    need = len(args.last) * sum(62 * t * h * 2 * 1.1 + 12 * t * h * 2 for s in args.shapes for n, h in [SHAPES[s]]
                                for t in args.tokens)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="ef-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need * 1.2:
        raise SystemExit(f"{folder}: {free / 1e9:.1f} GB free, the synthetic sweeps need {need / 1e9:.1f} GB")
    report: dict[str, Any] = {"cpus": os.cpu_count(), "load_before": os.getloadavg(), "shapes": {},
                              "python": sys.version.split()[0]}
    # pip compiles a package's bytecode when it installs it; an editable install run with
    # PYTHONDONTWRITEBYTECODE=1 would compile every module's source in every run (~0.05 s of start-up)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "eagleforensics")], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        if "gpu" in modes:
            import torch

            if torch.cuda.is_available():
                report["h2d"] = h2d_rate()
            else:
                columns = [c for c in columns if c[0] != "gpu"]
        if any(m in ("cli", "fused") for m, _ in columns):
            report["compile_s"] = kernels_compiled()
        if not args.no_startup:
            report["startup"] = startup(max(args.repeat, 5))
        for shape in args.shapes:
            for last in args.last:
                key = shape if last == "postnorm" else f"{shape}/raw-last"
                report["shapes"][key] = bench_shape(shape, args, folder, columns, last)
                print_shape(key, report["shapes"][key], args.tokens)
    finally:
        if args.dir is None and not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    report["load_after"] = os.getloadavg()
    print(f"\nload average (1/5/15 min) before {'/'.join(f'{x:.1f}' for x in report['load_before'])}, after "
          f"{'/'.join(f'{x:.1f}' for x in report['load_after'])} on {report['cpus']} CPUs (other processes on "
          "these cores slow every figure; quote figures from a quiet machine)")
    if "startup" in report:
        s = report["startup"]
        print(f"start-up (best / median of {len(s['help']['walls'])}): eagleforensics --help "
              f"{s['help']['wall']:.3f} / {s['help']['median']:.3f} s; align on the safetensors samples "
              f"{s['safetensors']['wall']:.3f} / {s['safetensors']['median']:.3f} s (target < {TARGETS['sample']} s, "
              f"{s['safetensors']['rss'] / 2**20:.0f} MiB, torch {'IMPORTED' if s['safetensors']['torch'] else 'not imported'}); "
              f"on the .ckpt sample and capture.pt {s['ckpt']['wall']:.3f} / {s['ckpt']['median']:.3f} s "
              f"(torch {'IMPORTED' if s['ckpt']['torch'] else 'not imported'})")
    for shape, r in report["shapes"].items():
        small = str(args.tokens[0])
        for c, col in r["columns"].items():
            if c.startswith("cli/ckpt"):
                print(f"{shape}: align with the .ckpt record at T={small}: {col['by_tokens'][small]['wall']:.3f} s "
                      f"(target <= {TARGETS['t512_ckpt']} s); median marginal {col['ratio_median']:.2f}x cat "
                      f"(target >= {TARGETS['ratio']}x)")
    if "h2d" in report:
        print("host-to-device copy: " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in report["h2d"].items()))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
