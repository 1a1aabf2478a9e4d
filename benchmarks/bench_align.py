"""Benchmark ``eagleforensics align`` at Kimi-K2 and Llama-8B shapes: throughput, start-up, peak memory.

    python benchmarks/bench_align.py                   # both shapes, T = 512 and 2048, CPU
    python benchmarks/bench_align.py --device cuda     # the GPU mode (adds the host-to-device copy rate)

Reports, per shape, in one run:

* marginal throughput: (capture bytes at T=2048 - at T=512) / (align seconds at 2048 - at 512),
  so interpreter start-up and imports cancel; as a ratio to the page-cache read rate of the
  same file (``cat FILE > /dev/null`` after a warm read, best of 3) measured in the same run;
* peak RSS of the align process (``wait4`` rusage) over the capture's size, and over and
  above a bare ``import torch`` process;
* whether align placed the three aux slots and the post-norm final where they were drawn from.

And once: ``eagleforensics --help`` and ``align`` on data_samples (start-up). Each align
run is repeated (best wall time kept). Synthetic files go to a temporary folder (or
``--dir``), checked against free disk space first, and are deleted afterwards unless ``--keep``.
"""
from __future__ import annotations

import argparse
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

def run(cmd: list[str]) -> tuple[float, int, int, str, float]:
    """Wall seconds, exit code, peak RSS in bytes (the child's own, via peakrss.py), CPU seconds, stdout."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(PEAKRSS), *cmd], stdout=subprocess.PIPE, stderr=err, cwd=ROOT)
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


def best(cmd: list[str], repeat: int) -> dict[str, Any]:
    runs = [run(cmd) for _ in range(repeat)]
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


def placed_right(out: str, sweep: Sweep) -> bool:
    doc = json.loads(out)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--tokens", nargs=2, type=int, default=[512, 2048], metavar=("T_SMALL", "T_LARGE"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where the synthetic files go (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic files")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--no-fingerprint", action="store_true", help="skip fingerprinting the large sweep")
    ap.add_argument("--inproc", action="store_true",
                    help="also time align inside this process after a warm-up (GPU mode: CUDA start-up varies by "
                         "seconds between processes, more than the whole sweep takes)")
    args = ap.parse_args()
    args.inproc = args.inproc or args.device != "cpu"

    need = sum(62 * t * h * 2 * 1.1 + 4 * t * h * 2 for s in args.shapes for n, h in [SHAPES[s]] for t in args.tokens)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="ef-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need * 1.2:
        raise SystemExit(f"{folder}: {free / 1e9:.1f} GB free, the synthetic sweeps need {need / 1e9:.1f} GB")
    report: dict[str, Any] = {"device": args.device, "cpus": os.cpu_count(), "shapes": {},
                              "load_before": os.getloadavg()[0]}
    try:
        report["help_s"] = best([*CLI, "--help"], 5)["wall"]
        tiny = best([*CLI, "align", "data_samples/record_layer_outputs.pt", "data_samples/capture.pt",
                     "--device", args.device], args.repeat)
        report["tiny_align_s"] = tiny["wall"]
        report["import_torch_rss"] = best([sys.executable, "-c", "import torch"], 1)["rss"]
        if args.device != "cpu":
            import torch

            if torch.cuda.is_available():
                report["h2d"] = h2d_rate()
        for shape in args.shapes:
            rows: dict[str, Any] = {}
            for t in args.tokens:
                t0 = time.perf_counter()
                sweep = write_sweep(folder, shape, t)
                made = time.perf_counter() - t0
                rate = read_rate(sweep.capture)
                res = best([*CLI, "align", str(sweep.record), str(sweep.capture), "--json", "--device", args.device],
                           args.repeat)
                rows[str(t)] = {"bytes": sweep.capture_bytes, "read_rate": rate, "wall": res["wall"], "cpu": res["cpu"],
                                "rss": res["rss"], "rc": res["rc"], "placed_right": placed_right(res["out"], sweep),
                                "write_s": made, "out": res["out"]}
            small, large = (rows[str(t)] for t in args.tokens)
            if args.inproc:
                for t in args.tokens:
                    rows[str(t)]["inproc_s"] = inproc_seconds(write_sweep(folder, shape, t), args.device, args.repeat)
            if not args.no_fingerprint:
                fp = folder / f"{shape}-T{args.tokens[1]}.fp.json"
                made = best([*FP_CLI, str(sweep.capture), "-o", str(fp), "--device", args.device], 1)
                est = best([*CLI, "align", str(sweep.record), str(fp), "--json"], 1)
                same = json.loads(est["out"])["verdict"] == json.loads(large["out"])["verdict"]
                large["fingerprint"] = {"write_s": made["wall"], "bytes": fp.stat().st_size, "align_s": est["wall"],
                                        "same_verdict": same}
            extra_bytes = large["bytes"] - small["bytes"]
            extra_s = max(large["wall"] - small["wall"], 1e-9)
            rate = max(small["read_rate"], large["read_rate"])  # the faster cat: the harder bar
            report["shapes"][shape] = {
                "by_tokens": rows, "marginal_bytes_per_s": extra_bytes / extra_s,
                "marginal_bytes_per_cpu_s": extra_bytes / max(large["cpu"] - small["cpu"], 1e-9),
                "read_rate": rate, "ratio": extra_bytes / extra_s / rate,
                "rss_over_capture": large["rss"] / large["bytes"],
                "rss_above_torch_over_capture": (large["rss"] - report["import_torch_rss"]) / large["bytes"],
            }
            if args.inproc:
                report["shapes"][shape]["inproc_marginal_bytes_per_s"] = extra_bytes / max(
                    large["inproc_s"] - small["inproc_s"], 1e-9)
            _print_shape(shape, report["shapes"][shape], report)
    finally:
        if args.dir is None and not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    report["load_after"] = os.getloadavg()[0]
    print(f"load average (1 min) before {report['load_before']:.2f}, after {report['load_after']:.2f} "
          f"on {report['cpus']} CPUs: other processes share these cores and slow every figure")
    print(f"start-up: eagleforensics --help {report['help_s']:.3f} s; align on data_samples {report['tiny_align_s']:.2f} s"
          f"; bare `import torch` peak RSS {report['import_torch_rss'] / 2**20:.0f} MiB")
    if "h2d" in report:
        print("host-to-device copy: " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in report["h2d"].items()))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))


def _print_shape(shape: str, r: dict[str, Any], report: dict[str, Any]) -> None:
    n, h = SHAPES[shape]
    print(f"\n{shape} (N={n}, H={h}), device {report['device']}")
    for t, row in r["by_tokens"].items():
        print(f"  T={t:>5}: capture {row['bytes'] / 1e9:.2f} GB, align {row['wall']:.2f} s ({row['cpu']:.2f} CPU-s) "
              f"({row['bytes'] / row['wall'] / 1e9:.2f} GB/s overall), peak RSS {row['rss'] / 2**20:.0f} MiB "
              f"({row['rss'] / row['bytes']:.2f}x capture), cat {row['read_rate'] / 1e9:.1f} GB/s, "
              f"verdict {'right' if row['placed_right'] else 'WRONG'} (exit {row['rc']})")
    sizes = sorted(r["by_tokens"], key=int)
    extra_s = r["by_tokens"][sizes[-1]]["wall"] - r["by_tokens"][sizes[0]]["wall"]
    if report["device"] != "cpu" or extra_s < 0.05:
        rate = (f"  marginal throughput between processes: not measurable (start-up varies by more than the "
                f"extra {extra_s:+.2f} s); see in-process below")
    else:
        rate = (f"  marginal throughput {r['marginal_bytes_per_s'] / 1e9:.2f} GB/s = {r['ratio']:.2f}x the page-cache "
                f"read rate ({r['marginal_bytes_per_cpu_s'] / 1e9:.2f} GB per CPU-second)")
    print(f"{rate}; peak RSS {r['rss_over_capture']:.2f}x capture ({r['rss_above_torch_over_capture']:.2f}x "
          "above a bare torch import)", flush=True)
    if "inproc_marginal_bytes_per_s" in r:
        rate = r["inproc_marginal_bytes_per_s"]
        secs = ", ".join(f"T={t} {row['inproc_s']:.3f} s" for t, row in r["by_tokens"].items())
        extra = f", {rate / report['h2d']['pinned']:.2f}x the pinned host-to-device rate" if "h2d" in report else ""
        print(f"  in-process (warm) align: {secs}; marginal {rate / 1e9:.2f} GB/s = {rate / r['read_rate']:.2f}x "
              f"the page-cache read rate{extra}", flush=True)
    for t, row in r["by_tokens"].items():
        row.pop("out", None)
        f = row.get("fingerprint")
        if f:
            print(f"  fingerprint of T={t}: written in {f['write_s']:.2f} s, {f['bytes'] / 1e6:.1f} MB "
                  f"({f['bytes'] / row['bytes']:.1%} of the capture); align on it {f['align_s']:.2f} s, "
                  f"verdict {'the same as' if f['same_verdict'] else 'DIFFERENT from'} the full capture's", flush=True)


if __name__ == "__main__":
    main()
