"""Benchmark the shard-index reader (``io/shardindex.py`` through ``io.modeldir.read_index``) and ``doctor --target``
on published partial downloads (config + shard index only), each a fresh process started from ``peakrss.py``.

    python benchmarks/bench_shardindex.py [--dir /tmp/efindex] [--repeat 3]

Inputs: the DeepSeek-R1 and Kimi-K2-Instruct indexes of ``tests/fixtures/published`` (unpacked beside their
configs: a partial download), and two synthetic indexes just under the 64 MiB cap (``MAX_INDEX_BYTES``): one whose
``weight_map`` is 64 MiB of names (about 750k entries, under the 1M cap), one whose ``metadata`` is 64 MiB of empty
lists beside a DeepSeek-sized ``weight_map`` (``json.loads`` of that built 1.9 GiB). Each reader run is compared
with plain ``json.loads`` of the same file. Prints wall (best of ``--repeat``, process start included), the
reader's own seconds and the child's peak RSS.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PUBLISHED = ROOT / "tests" / "fixtures" / "published"
CAP = 64 * 1024 * 1024 - 4096  # just under io.modeldir.MAX_INDEX_BYTES

READER = ("import sys, time; from eagleforensics.io.modeldir import read_index; t = time.perf_counter(); "
          "m = read_index(sys.argv[1]); print(len(m), round(time.perf_counter() - t, 3))")
PLAIN = ("import sys, time, json; t = time.perf_counter(); m = json.loads(open(sys.argv[1], 'rb').read())"
         "['weight_map']; print(len(m), round(time.perf_counter() - t, 3))")


def unpack(name: str, out: Path) -> Path:
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(PUBLISHED / name / "config.json", d / "config.json")
    with gzip.open(PUBLISHED / name / "model.safetensors.index.json.gz", "rb") as src:
        (d / "model.safetensors.index.json").write_bytes(src.read())
    return d


def synthetic_names(out: Path) -> Path:
    """A weight_map of names only, padded to just under the cap."""
    p = out / "names" / "model.safetensors.index.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w") as fh:
        fh.write('{"metadata": {"total_size": 1}, "weight_map": {')
        n, size = 0, 60
        while size < CAP - 200:
            line = (", " if n else "") + (f'"model.layers.{n // 3000}.mlp.experts.{n % 3000}.gate_proj.weight_scale_inv": '
                                          f'"model-{n % 163 + 1:05d}-of-00163.safetensors"')
            fh.write(line)
            size += len(line)
            n += 1
        fh.write("}}")
    return p


def synthetic_metadata(out: Path, names: dict[str, str]) -> Path:
    """64 MiB of empty lists in ``metadata`` beside a real weight_map (the case json.loads built 1.9 GiB on)."""
    p = out / "metadata" / "model.safetensors.index.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    wm = json.dumps({"weight_map": names})[1:-1]
    room = CAP - len(wm) - 64
    with p.open("w") as fh:
        fh.write('{"metadata": {"pad": [')
        fh.write(",".join(["[]"] * (room // 3)))
        fh.write("]}, " + wm + "}")
    return p


def child(args: list[str], repeat: int) -> dict:
    """Best wall of ``repeat`` fresh processes (under peakrss.py), their largest peak RSS and the last stdout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    best, rss, out, code = float("inf"), 0, "", 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, str(HERE / "peakrss.py"), sys.executable, *args], capture_output=True,
                              text=True, env=env, timeout=900)
        best = min(best, time.perf_counter() - t0)
        rss = max(rss, next((int(x.split("=")[1]) for x in reversed(proc.stderr.splitlines())
                             if x.startswith("peak_rss_kib=")), 0))
        out, code = proc.stdout, proc.returncode
    return {"wall_s": round(best, 2), "peak_rss_mib": round(rss / 1024, 1), "exit": code, "stdout": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/efindex"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    r1, kimi = unpack("deepseek-r1", args.dir), unpack("kimi-k2-instruct", args.dir)
    names = synthetic_names(args.dir)
    real = json.loads((r1 / "model.safetensors.index.json").read_bytes())["weight_map"]
    meta = synthetic_metadata(args.dir, real)
    rows = []
    for label, idx in (("deepseek-r1 index", r1 / "model.safetensors.index.json"),
                       ("kimi-k2 index", kimi / "model.safetensors.index.json"),
                       ("synthetic names", names), ("synthetic metadata", meta)):
        mib = idx.stat().st_size / 2 ** 20
        for how, code in (("read_index", READER), ("json.loads", PLAIN)):
            r = child(["-c", code, str(idx)], args.repeat)
            got = r["stdout"].split()
            rows.append((f"{label} ({mib:.1f} MiB)", how, r, got[0] if got else "-", got[1] if len(got) > 1 else "-"))
    for label, d in (("doctor --target deepseek-r1", r1), ("doctor --target kimi-k2", kimi)):
        r = child(["-m", "eagleforensics", "doctor", "--target", str(d), "--json"], args.repeat)
        try:
            doc = json.loads(r["stdout"])
            ran = sum(c["status"] != "not-run" for c in doc.get("checks", []))
            codes = sorted({f["code"] for f in doc.get("findings", [])})
            note = f"{ran} rows ran; findings {codes}"
        except (json.JSONDecodeError, KeyError, TypeError):
            note = "no JSON"
        rows.append((label, "doctor", r, "-", note))
    print(f"{'input':<36} {'how':<11} {'wall s':>7} {'RSS MiB':>8} {'exit':>4}  entries  own s / notes")
    for label, how, r, n, own in rows:
        print(f"{label:<36} {how:<11} {r['wall_s']:>7.2f} {r['peak_rss_mib']:>8.1f} {r['exit']:>4}  {n:>7}  {own}")


if __name__ == "__main__":
    main()
