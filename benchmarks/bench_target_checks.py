"""The target-side checks (issue 34) at real scale: a DeepSeek-V3-shaped target directory and a 500k-record dataset.

The target is 163 safetensors shards holding DeepSeek-V3's 61 decoder layers, its MTP layer 61
and the embedding / head (about 91k tensor names, FP8 experts with their block scales, real
shapes), with a block-FP8 ``quantization_config``; the shards are sparse files (their data
regions are holes: only the headers are written), so the directory costs a few MB of disk while
every check sees the sizes a download has. Three variants: complete, MTP layer dropped from the
index and its shard (the GLM-5-NVFP4 export of vllm-project/vllm#35548), and a partial download
(the index lists shards not on disk). The dataset is a directory of N empty record files (the
data-size check counts files; it reads only ``--max-records`` of them, here links to one real record).

For each: ``python -m eagleforensics doctor ... --json`` in a fresh process (wall, CPU, peak RSS
through ``peakrss.py``), best of ``--repeat``, against the machine's own limits: the header bytes
read against ``cat`` of the same headers (read rate), and the record count against ``find DIR -type f``
(directory walk rate).

    python benchmarks/bench_target_checks.py [--records 500000] [--repeat 3] [--dir /tmp/efbench-target]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H, VOCAB, LAYERS, DENSE, EXPERTS, INTER, MOE_INTER = 7168, 129280, 61, 3, 256, 18432, 2048
QCONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}


def _fp8(prefix: str, rows: int, cols: int) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(f"{prefix}.weight", "F8_E4M3", (rows, cols)),
            (f"{prefix}.weight_scale_inv", "F32", (-(-rows // 128), -(-cols // 128)))]


def layer_tensors(i: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """DeepSeek-V3's tensors for decoder layer ``i`` (MLA attention, dense or MoE MLP), FP8 where it is."""
    p = f"model.layers.{i}"
    out = [(f"{p}.input_layernorm.weight", "BF16", (H,)), (f"{p}.post_attention_layernorm.weight", "BF16", (H,)),
           (f"{p}.self_attn.q_a_layernorm.weight", "BF16", (1536,)),
           (f"{p}.self_attn.kv_a_layernorm.weight", "BF16", (512,))]
    out += _fp8(f"{p}.self_attn.q_a_proj", 1536, H) + _fp8(f"{p}.self_attn.q_b_proj", 128 * 192, 1536)
    out += _fp8(f"{p}.self_attn.kv_a_proj_with_mqa", 576, H) + _fp8(f"{p}.self_attn.kv_b_proj", 128 * 256, 512)
    out += _fp8(f"{p}.self_attn.o_proj", H, 128 * 128)
    if i < DENSE:
        for name, r, c in (("gate_proj", INTER, H), ("up_proj", INTER, H), ("down_proj", H, INTER)):
            out += _fp8(f"{p}.mlp.{name}", r, c)
        return out
    out += [(f"{p}.mlp.gate.weight", "BF16", (EXPERTS, H)), (f"{p}.mlp.gate.e_score_correction_bias", "F32",
                                                              (EXPERTS,))]
    for e in [*range(EXPERTS), "shared"]:
        q = f"{p}.mlp.experts.{e}" if e != "shared" else f"{p}.mlp.shared_experts"
        for name, r, c in (("gate_proj", MOE_INTER, H), ("up_proj", MOE_INTER, H), ("down_proj", H, MOE_INTER)):
            out += _fp8(f"{q}.{name}", r, c)
    return out


def mtp_tensors(i: int) -> list[tuple[str, str, tuple[int, ...]]]:
    p = f"model.layers.{i}"
    return layer_tensors(i) + [(f"{p}.enorm.weight", "BF16", (H,)), (f"{p}.hnorm.weight", "BF16", (H,)),
                               (f"{p}.eh_proj.weight", "BF16", (H, 2 * H)),
                               (f"{p}.shared_head.norm.weight", "BF16", (H,))]


_SIZE = {"F8_E4M3": 1, "F32": 4, "BF16": 2}


def write_shard(path: Path, tensors: list[tuple[str, str, tuple[int, ...]]]) -> int:
    """A safetensors file whose data region is a hole (sparse): the header is real, the weights are not written."""
    header, off = {}, 0
    for name, dtype, shape in tensors:
        n = _SIZE[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + off)
    return 8 + len(raw)


def write_target(out: Path, *, drop_mtp: bool = False, missing_shards: int = 0) -> int:
    """The DeepSeek-V3-shaped target; returns the header bytes its shards hold."""
    out.mkdir(parents=True)
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": H,
           "vocab_size": VOCAB, "num_hidden_layers": LAYERS, "num_nextn_predict_layers": 1,
           "first_k_dense_replace": DENSE, "n_routed_experts": EXPERTS, "max_position_embeddings": 163840,
           "torch_dtype": "bfloat16", "quantization_config": QCONFIG}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    groups = [[("model.embed_tokens.weight", "BF16", (VOCAB, H))]] + [layer_tensors(i) for i in range(LAYERS)]
    if not drop_mtp:
        groups.append(mtp_tensors(LAYERS))
    groups.append([("model.norm.weight", "BF16", (H,)), ("lm_head.weight", "BF16", (VOCAB, H))])
    # 163 shards as the release has: the layers' tensors spread evenly
    flat = [t for g in groups for t in g]
    per = -(-len(flat) // 163)
    wmap, header_bytes = {}, 0
    shards = [flat[k:k + per] for k in range(0, len(flat), per)]
    for k, chunk in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        for t in chunk:
            wmap[t[0]] = name
        if k >= len(shards) - missing_shards:
            continue  # not downloaded yet
        header_bytes += write_shard(out / name, chunk)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    return header_bytes


def write_config(out: Path) -> bool:
    """A target directory holding only its config.json (what a user has before downloading weights)."""
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": H,
           "vocab_size": VOCAB, "num_hidden_layers": LAYERS, "num_nextn_predict_layers": 1,
           "torch_dtype": "bfloat16", "quantization_config": QCONFIG}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return True


def read_headers(target: Path, repeat: int) -> float:
    """Best time to read every shard's header bytes in this process: the floor for listing the tensor names."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for f in sorted(target.glob("*.safetensors")):
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                json.loads(fh.read(n))
        best = min(best, time.perf_counter() - t0)
    return best


def timed(cmd: list[str], repeat: int) -> dict[str, float]:
    """Best wall time, its CPU time and the largest peak RSS of ``cmd`` run ``repeat`` times from peakrss.py."""
    best: dict[str, float] = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), os.times()
        res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peakrss.py"), *cmd], capture_output=True,
                             text=True, env=env, timeout=1800)
        wall, c1 = time.perf_counter() - t0, os.times()
        cpu = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
        rss = int(res.stderr.strip().rsplit("peak_rss_kib=", 1)[-1]) / 1024
        if not best or wall < best["wall"]:
            best = {"wall": wall, "cpu": cpu, "rss_mib": rss, "rc": res.returncode, "out": res.stdout}
    return best


def rate(cmd: str, repeat: int) -> float:
    """Best wall time of a shell command (the machine's own limit for the same work)."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL)
        out.append(time.perf_counter() - t0)
    return min(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="efbench-target-"))
    if base.exists() and any(base.iterdir()):
        shutil.rmtree(base)
    base.mkdir(parents=True, exist_ok=True)
    try:
        doctor = [sys.executable, "-m", "eagleforensics", "doctor", "--json"]
        bare = base / "config-only"
        bare.mkdir()
        cfg_only = timed([*doctor, "--target", str(bare)], args.repeat) if write_config(bare) else {}
        print(f"{'case':30} {'wall s':>7} {'cpu s':>6} {'peak MiB':>8}  {'listing s':>9} {'raw read s':>10} "
              f"{'ratio':>6}  mtp-weights")
        print(f"{'config.json only (baseline)':30} {cfg_only['wall']:7.2f} {cfg_only['cpu']:6.2f} "
              f"{cfg_only['rss_mib']:8.0f}")
        for label, kw in (("complete (with MTP layer 61)", {}), ("MTP layer dropped", {"drop_mtp": True}),
                          ("partial download (3 shards)", {"missing_shards": 3})):
            t = base / label.split()[0]
            hb = write_target(t, **kw)
            raw = read_headers(t, args.repeat)
            got = timed([*doctor, "--target", str(t)], args.repeat)
            obj = json.loads(got["out"]) if got["out"].strip().startswith("{") else {}
            row = next((c for c in obj.get("checks", []) if c["name"] == "mtp-weights"), {})
            listing = got["wall"] - cfg_only["wall"]
            what = row.get("status", "-") + (":" + ",".join(row["codes"]) if row.get("codes") else "")
            if row.get("status") == "not-run":
                what += f" ({row.get('reason', '')[:90]})"
            print(f"{label:30} {got['wall']:7.2f} {got['cpu']:6.2f} {got['rss_mib']:8.0f}  {listing:9.2f} "
                  f"{raw:10.3f} {listing / raw:6.1f}  {what} [{hb / 2**20:.1f} MB of headers; exit {got['rc']}]")
        record = ROOT / "data_samples" / "data_0.ckpt"
        walls = {}
        for n in (8, args.records):
            data = base / f"data-{n}"
            data.mkdir()
            for i in range(n):
                p = data / f"data_{i}.ckpt"
                if i < 8:
                    os.symlink(record, p)
                else:
                    p.touch()
            got = timed([*doctor, "--train", str(data), "--max-records", "8"], args.repeat)
            walls[n] = got
        find = rate(f"find {base / f'data-{args.records}'} -type f -o -type l | wc -l", args.repeat)
        got = walls[args.records]
        obj = json.loads(got["out"]) if got["out"].strip().startswith("{") else {}
        row = next((c for c in obj.get("checks", []) if c["name"] == "data-size"), {})
        count = got["wall"] - walls[8]["wall"]
        print(f"\n{'dataset':30} {'wall s':>7} {'cpu s':>6} {'peak MiB':>8}  {'count s':>9} {'find s':>10} "
              f"{'ratio':>6}  data-size")
        print(f"{'8 records (baseline)':30} {walls[8]['wall']:7.2f} {walls[8]['cpu']:6.2f} {walls[8]['rss_mib']:8.0f}")
        print(f"{f'{args.records:,} records':30} {got['wall']:7.2f} {got['cpu']:6.2f} {got['rss_mib']:8.0f}  "
              f"{count:9.2f} {find:10.3f} {count / find:6.1f}  {row.get('status')}:{','.join(row.get('codes', []))} "
              f"records {row.get('data', {}).get('records')}")
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
