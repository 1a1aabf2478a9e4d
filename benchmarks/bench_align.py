"""Benchmark ``eagleforensics align`` at Kimi-K2 and Llama-8B shapes: throughput, start-up, peak memory.

    python benchmarks/bench_align.py                   # both shapes, T = 512 and 2048, every CPU mode
    python benchmarks/bench_align.py --device cuda     # adds the GPU mode (and the host-to-device copy rate)

Reports, per shape, in one run, side by side for each way of scoring: ``cat`` of the file; a plain
torch loop (``torchloop.py``: the same sums as one torch operation each, the baseline); the numpy
path (``EAGLEFORENSICS_FUSED=0``); the compiled numba kernels (the default for large captures);
GPU mode where there is a GPU. The training record is read from safetensors, so the CPU modes of
``align`` never import torch (``--record pt`` reads the ``.pt`` copy instead):

* marginal throughput: (capture bytes at T=2048 - at T=512) / (align seconds at 2048 - at 512),
  so interpreter start-up and imports cancel; as a ratio to the page-cache read rate of the
  same file (``cat FILE > /dev/null`` after a warm read, best of 3) measured in the same run;
* peak RSS of the align process (``wait4`` rusage) over the capture's size;
* whether align placed the three aux slots and the post-norm final where they were drawn from.

And once: ``eagleforensics --help``, ``align`` on the two safetensors samples (start-up: by default,
on the numpy path, and with the kernels forced, from an empty numba cache folder, so they compile,
then from the filled one). Each align run is
repeated (best wall time kept). Synthetic files go to a temporary folder (or ``--dir``),
checked against free disk space first, and are deleted afterwards unless ``--keep``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from synth import SHAPES, Sweep, write_sweep  # noqa: E402

CLI = [sys.executable, "-m", "eagleforensics"]
FP_CLI = [sys.executable, "-c", "from eagleforensics.cli.fingerprint import fingerprint; fingerprint()"]


PEAKRSS = Path(__file__).resolve().parent / "peakrss.py"

MODES = {  # name -> (environment, --device); "torch-loop" runs torchloop.py instead of align
    "torch-loop": ({}, "cpu"),
    "numpy": ({"EAGLEFORENSICS_FUSED": "0"}, "cpu"),
    "fused": ({"EAGLEFORENSICS_FUSED": "1"}, "cpu"),
    "gpu": ({}, "cuda"),
}
TORCH_LOOP = [sys.executable, str(Path(__file__).resolve().parent / "torchloop.py")]
SAMPLE = ["data_samples/record_layer_outputs.safetensors", "data_samples/capture_sweep.safetensors"]


def run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, int, str, float]:
    """Wall seconds, exit code, peak RSS in bytes (the child's own, via peakrss.py), CPU seconds, stdout."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(PEAKRSS), *cmd], stdout=subprocess.PIPE, stderr=err, cwd=ROOT,
                                env={**os.environ, **(env or {})})
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code not in (0, 1):
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed ({code}): {err.read().decode()[-2000:]}")
        err.seek(0)
        peak_kib = int(err.read().decode().rstrip().rsplit("peak_rss_kib=", 1)[1])
    return wall, code, peak_kib * 1024, out.decode(), usage.ru_utime + usage.ru_stime


def best(cmd: list[str], repeat: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    runs = [run(cmd, env) for _ in range(repeat)]
    wall = min(r[0] for r in runs)
    return {"wall": wall, "rc": runs[0][1], "rss": max(r[2] for r in runs), "out": runs[0][3],
            "cpu": min(r[4] for r in runs)}


def read_rate(path: Path, repeat: int = 3) -> float:
    """Page-cache read rate (bytes/s) of ``cat FILE > /dev/null`` after a warm read."""
    subprocess.run(f"cat '{path}' > /dev/null", shell=True, check=True)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(f"cat '{path}' > /dev/null", shell=True, check=True)
        times.append(time.perf_counter() - t0)
    return path.stat().st_size / min(times)


def placed_right(out: str, sweep: Sweep) -> bool | None:
    doc = json.loads(out)
    if "mapping" not in doc:  # the torch loop: sums only, no verdict
        return None
    got = [(m["position"], m["post_norm"], m["confident"]) for m in doc["mapping"]]
    want = [(p, False, True) for p in sweep.aux_positions] + [(sweep.num_layers, True, True)]
    return got == want


def inproc_seconds(sweep: Sweep, device: str, repeat: int) -> float:
    """Best wall time of ``align`` called in this process (imports and CUDA start-up already paid)."""
    from eagleforensics.alignment import align

    align(sweep.record, sweep.capture, device=device)  # warm: CUDA context, kernels, page cache
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        align(sweep.record, sweep.capture, device=device)
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


def compile_seconds(repeat: int) -> dict[str, float]:
    """``align`` on the two safetensors samples: by default (numpy: the capture is small), and with
    the kernels forced from an empty numba cache folder (compiles), then with it filled."""
    cmd = [*CLI, "align", *SAMPLE]
    auto = best(cmd, max(repeat, 5))
    with tempfile.TemporaryDirectory(prefix="ef-numba-") as cache:
        env = {"NUMBA_CACHE_DIR": cache, "EAGLEFORENSICS_FUSED": "1"}
        first = run(cmd, env)[0]
        cached = best(cmd, repeat, env)["wall"]
    numpy_path = best(cmd, repeat, MODES["numpy"][0])["wall"]
    return {"first": first, "cached": cached, "numpy_path": numpy_path, "auto": auto["wall"], "auto_rss": auto["rss"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--tokens", nargs=2, type=int, default=[512, 2048], metavar=("T_SMALL", "T_LARGE"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"),
                    help="cuda/auto add the GPU mode beside the CPU ones")
    ap.add_argument("--modes", nargs="+", default=None, choices=list(MODES),
                    help="which ways of scoring to time (default: torch-loop, numpy and fused, plus gpu with "
                         "--device cuda)")
    ap.add_argument("--record", choices=("safetensors", "pt"), default="safetensors",
                    help="which copy of the training record align reads (pt imports torch)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where the synthetic files go (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic files")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--no-fingerprint", action="store_true", help="skip fingerprinting the large sweep")
    ap.add_argument("--inproc", action="store_true",
                    help="also time align inside this process after a warm-up (always for the GPU mode: CUDA "
                         "start-up varies by seconds between processes, more than the whole sweep takes)")
    args = ap.parse_args()
    modes = args.modes or ["torch-loop", "numpy", "fused"] + (["gpu"] if args.device != "cpu" else [])

    need = sum(62 * t * h * 2 * 1.1 + 4 * t * h * 2 for s in args.shapes for n, h in [SHAPES[s]] for t in args.tokens)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="ef-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need * 1.2:
        raise SystemExit(f"{folder}: {free / 1e9:.1f} GB free, the synthetic sweeps need {need / 1e9:.1f} GB")
    report: dict[str, Any] = {"device": args.device, "modes": modes, "cpus": os.cpu_count(), "shapes": {},
                              "load_before": os.getloadavg()}
    try:
        report["help_s"] = best([*CLI, "--help"], 5)["wall"]
        report["compile"] = compile_seconds(args.repeat)
        report["import_torch_rss"] = best([sys.executable, "-c", "import torch"], 1)["rss"]
        if "gpu" in modes:
            import torch

            if torch.cuda.is_available():
                report["h2d"] = h2d_rate()
            else:
                modes.remove("gpu")
        for shape in args.shapes:
            rows: dict[str, Any] = {}
            sweeps = {}
            for t in args.tokens:
                t0 = time.perf_counter()
                sweep = sweeps[t] = write_sweep(folder, shape, t)
                row: dict[str, Any] = {"bytes": sweep.capture_bytes, "write_s": time.perf_counter() - t0,
                                       "read_rate": read_rate(sweep.capture), "modes": {}}
                record = sweep.record if args.record == "pt" else sweep.record_safetensors
                for mode in modes:
                    env, device = MODES[mode]
                    cmd = [*TORCH_LOOP, str(sweep.capture), str(sweep.record_safetensors)] if mode == "torch-loop" \
                        else [*CLI, "align", str(record), str(sweep.capture), "--json", "--device", device]
                    res = best(cmd, args.repeat, env)
                    row["modes"][mode] = {"wall": res["wall"], "cpu": res["cpu"], "rss": res["rss"], "rc": res["rc"],
                                          "placed_right": placed_right(res["out"], sweep), "out": res["out"]}
                rows[str(t)] = row
            small, large = (rows[str(t)] for t in args.tokens)
            if args.inproc or "gpu" in modes:
                for mode in modes:
                    if mode == "torch-loop":
                        continue
                    if mode == "gpu" or args.inproc:
                        for t in args.tokens:
                            os.environ.update(MODES[mode][0])
                            from eagleforensics.evidence import fused

                            fused.AVAILABLE = mode != "numpy" and importlib.util.find_spec("numba") is not None
                            fused.MIN_BYTES = 0
                            rows[str(t)]["modes"][mode]["inproc_s"] = inproc_seconds(
                                sweeps[t], MODES[mode][1], args.repeat)
            if not args.no_fingerprint:
                fp = folder / f"{shape}-T{args.tokens[1]}.fp.json"
                made = best([*FP_CLI, str(sweeps[args.tokens[1]].capture), "-o", str(fp)], 1)
                est = best([*CLI, "align", str(sweeps[args.tokens[1]].record_safetensors), str(fp), "--json"], 1)
                full = next(large["modes"][m]["out"] for m in modes if m != "torch-loop")
                same = json.loads(est["out"])["verdict"] == json.loads(full)["verdict"]
                large["fingerprint"] = {"write_s": made["wall"], "bytes": fp.stat().st_size, "align_s": est["wall"],
                                        "same_verdict": same}
            extra_bytes = large["bytes"] - small["bytes"]
            rate = max(small["read_rate"], large["read_rate"])  # the faster cat: the harder bar
            summary: dict[str, Any] = {"by_tokens": rows, "read_rate": rate, "modes": {}}
            for mode in modes:
                a, b = small["modes"][mode], large["modes"][mode]
                m = {"marginal_bytes_per_s": extra_bytes / max(b["wall"] - a["wall"], 1e-9),
                     "marginal_bytes_per_cpu_s": extra_bytes / max(b["cpu"] - a["cpu"], 1e-9),
                     "rss_over_capture": b["rss"] / large["bytes"],
                     "rss_over_capture_small": a["rss"] / small["bytes"],
                     "all_right": None if a["placed_right"] is None else a["placed_right"] and b["placed_right"]}
                m["ratio"] = m["marginal_bytes_per_s"] / rate
                if "inproc_s" in b:
                    m["inproc_marginal_bytes_per_s"] = extra_bytes / max(b["inproc_s"] - a["inproc_s"], 1e-9)
                summary["modes"][mode] = m
            report["shapes"][shape] = summary
            _print_shape(shape, summary, report, args.tokens)
    finally:
        if args.dir is None and not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    report["load_after"] = os.getloadavg()
    print(f"\nload average (1/5/15 min) before {'/'.join(f'{x:.1f}' for x in report['load_before'])}, after "
          f"{'/'.join(f'{x:.1f}' for x in report['load_after'])} on {report['cpus']} CPUs: other processes "
          "share these cores and slow every figure")
    c = report["compile"]
    print(f"start-up: eagleforensics --help {report['help_s']:.3f} s; align on the two safetensors samples "
          f"{c['auto']:.2f} s by default ({c['auto_rss'] / 2**20:.0f} MiB peak RSS; numpy path "
          f"{c['numpy_path']:.2f} s); with the kernels forced {c['cached']:.2f} s (numba cache filled), "
          f"{c['first']:.2f} s with an empty cache (compiling); bare `import torch` peak RSS "
          f"{report['import_torch_rss'] / 2**20:.0f} MiB")
    if "h2d" in report:
        print("host-to-device copy: " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in report["h2d"].items()))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))


def _print_shape(shape: str, r: dict[str, Any], report: dict[str, Any], tokens: list[int]) -> None:
    n, h = SHAPES[shape]
    modes = list(r["modes"])
    rate = r["read_rate"]
    by = r["by_tokens"]
    small, large = by[str(tokens[0])], by[str(tokens[1])]
    width = 24
    print(f"\n{shape} (N={n}, H={h}): capture {small['bytes'] / 1e9:.2f} / {large['bytes'] / 1e9:.2f} GB at "
          f"T={tokens[0]} / {tokens[1]}")
    print(f"  {'':<30}{'cat':>{width}}" + "".join(f"{m:>{width}}" for m in modes))

    def line(label: str, cat: str, cells: list[str]) -> None:
        print(f"  {label:<30}{cat:>{width}}" + "".join(f"{c:>{width}}" for c in cells))

    for t in tokens:
        row = by[str(t)]
        line(f"T={t}: wall s (CPU s)", f"{row['bytes'] / row['read_rate']:.2f}",
             [f"{row['modes'][m]['wall']:.2f} ({row['modes'][m]['cpu']:.2f})" for m in modes])
    def extra(m: str) -> float:
        return large["modes"][m]["wall"] - small["modes"][m]["wall"]

    line("marginal GB/s", f"{rate / 1e9:.2f}", [
        f"{r['modes'][m]['marginal_bytes_per_s'] / 1e9:.2f}" if extra(m) > 0.05 else "not measurable" for m in modes])
    line("  / cat read rate", "1.00x", [f"{r['modes'][m]['ratio']:.2f}x" if extra(m) > 0.05 else "" for m in modes])
    def extra_cpu(m: str) -> float:
        return large["modes"][m]["cpu"] - small["modes"][m]["cpu"]

    line("  per CPU-second, GB", "", [f"{r['modes'][m]['marginal_bytes_per_cpu_s'] / 1e9:.2f}" if extra_cpu(m) > 0.05
                                     else "not measurable" for m in modes])
    if any("inproc_marginal_bytes_per_s" in r["modes"][m] for m in modes):
        line("in-process marginal / cat", "", [
            f"{r['modes'][m]['inproc_marginal_bytes_per_s'] / rate:.2f}x" if "inproc_marginal_bytes_per_s"
            in r["modes"][m] else "" for m in modes])
    line(f"peak RSS / capture T={tokens[0]}", "", [f"{r['modes'][m]['rss_over_capture_small']:.2f}x" for m in modes])
    line(f"peak RSS / capture T={tokens[1]}", "", [
        f"{r['modes'][m]['rss_over_capture']:.2f}x ({large['modes'][m]['rss'] / 2**20:.0f} MiB)" for m in modes])
    line("verdict", "", ["-" if r["modes"][m]["all_right"] is None else "right" if r["modes"][m]["all_right"]
                         else "WRONG" for m in modes])
    for t, row in by.items():
        for m in modes:
            row["modes"][m].pop("out", None)
        f = row.get("fingerprint")
        if f:
            print(f"  fingerprint of T={t}: written in {f['write_s']:.2f} s, {f['bytes'] / 1e6:.1f} MB "
                  f"({f['bytes'] / row['bytes']:.1%} of the capture); align on it {f['align_s']:.2f} s, "
                  f"verdict {'the same as' if f['same_verdict'] else 'DIFFERENT from'} the full capture's", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
