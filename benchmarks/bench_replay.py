"""Benchmark drafter replay: drafted tokens per second for the sample drafter and a Llama-8B-shaped drafter,
and what the tree and the sampling figures cost against the plain chain.

    python benchmarks/bench_replay.py                  # CPU: sample drafter, Llama-8B shape at T = 256
    python benchmarks/bench_replay.py --device cuda --tokens 2048 --layers 2

Throughput = start rows x draft steps / wall seconds of the chain (the forward of every step for every start
row, chunked as the CLI runs it; fc projection and prefix pass included; target tokens and scoring excluded,
they cost one lm_head pass). Median of ``--repeat`` after one warm-up. Then, on the same inputs:

* ``tree``: SGLang's EAGLE tree (``--topk``, ``--draft-tokens``) simulated node by node; the ratio is tree time
  over chain time (it runs ``topk`` queries per start row at every level after the first);
* ``sampling``: the chain plus the expected acceptance at temperature 0.7 (target softmax over the full
  vocabulary at every step); the ratio is over the plain chain.

* sample: data_samples/drafter (H=128, 1 layer, draft vocab 256) on capture_sweep.safetensors
  (40 rows), fed the trained wiring p3,p7,p10;
* llama-8b: H=4096, 32 heads / 8 kv heads of 128, MLP 14336, ``--layers`` decoder layers, llama3 rope scaling,
  draft vocabulary 32000 and, to keep the embedding small, a 32000-token target vocabulary (Llama-3-8B has
  128256; the embedding is a gather, so only memory changes); random float32 weights, random aux states and ids.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eagleforensics.arrays import to_torch
from eagleforensics.drafter.replay import DraftForward, TargetSide, replay_chain, target_tokens, tree_depths
from eagleforensics.io.capture import load_capture
from eagleforensics.io.drafter import DrafterSpec, load_drafter, load_target
from eagleforensics.positions import Position


def _time(fn, repeat: int, device: str) -> float:
    fn()  # warm-up
    runs = []
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def sample(device: str):
    samples = ROOT / "data_samples"
    drafter = load_drafter(samples / "drafter", target=samples / "target")
    cap = load_capture(samples / "capture_sweep.safetensors")
    aux = torch.cat([to_torch(cap.read(Position(p))).float() for p in (3, 7, 10)], -1)
    final = to_torch(cap.read(Position(12, True))).float()
    head = load_target(samples / "target", embed=False, norm=False).lm_head
    return DraftForward.of(drafter, device), aux, to_torch(cap.input_ids).long(), final, head


def llama8b(device: str, tokens: int, layers: int):
    h, vocab = 4096, 32000
    spec = DrafterSpec(path="synthetic", layout="specforge", hidden_size=h, target_hidden_size=h, num_heads=32,
                       num_kv_heads=8, head_dim=128, intermediate_size=14336, rms_norm_eps=1e-5, rope_theta=500000.0,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                       vocab_size=vocab, draft_vocab_size=32000, num_aux=3, num_layers=layers)
    gen = torch.Generator().manual_seed(0)

    def mat(o: int, i: int) -> torch.Tensor:
        return torch.randn(o, i, generator=gen) / i ** 0.5

    w = {"fc.weight": mat(h, 3 * h), "lm_head.weight": mat(32000, h), "embed": torch.randn(vocab, h, generator=gen),
         "d2t": torch.zeros(32000, dtype=torch.long), "norm.weight": torch.ones(h)}
    for i in range(layers):
        p, width = ("layer.", 2 * h) if i == 0 else (f"layers.{i}.", h)
        w.update({p + "self_attn.q_proj.weight": mat(4096, width), p + "self_attn.k_proj.weight": mat(1024, width),
                  p + "self_attn.v_proj.weight": mat(1024, width), p + "self_attn.o_proj.weight": mat(h, 4096),
                  p + "mlp.gate_proj.weight": mat(14336, h), p + "mlp.up_proj.weight": mat(14336, h),
                  p + "mlp.down_proj.weight": mat(h, 14336), p + "input_layernorm.weight": torch.ones(h),
                  p + "post_attention_layernorm.weight": torch.ones(h)})
        if i == 0:
            w[p + "hidden_norm.weight"] = torch.ones(h)
    fwd = DraftForward(spec, w, device)
    del w
    aux = torch.randn(tokens, 3 * h, generator=gen)
    ids = torch.randint(0, vocab, (tokens,), generator=gen)
    final = torch.randn(tokens, h, generator=gen)
    return fwd, aux, ids, final, mat(vocab, h)


def measure(name: str, case, args) -> None:
    fwd, aux, ids, final, head = case
    rows, steps = ids.shape[0], args.steps

    def prefix():
        h0, valid = fwd.project_rows(aux, rows)
        return fwd.prefix(h0, ids)

    with torch.no_grad():
        chain = _time(lambda: replay_chain(fwd, prefix(), steps), args.repeat, args.device)
        pre = prefix()
        y = target_tokens(final, head, args.device)
        tree = _time(lambda: tree_depths(fwd, pre, y, steps, args.topk, args.draft_tokens), args.repeat, args.device)
        side = TargetSide(lambda a, b: final[a:b], rows, head, args.device)
        sampled = _time(lambda: replay_chain(fwd, pre, steps, target=side, temperature=0.7), args.repeat, args.device)
        plain = _time(lambda: replay_chain(fwd, pre, steps), args.repeat, args.device)
    print(f"{name:9s} rows {rows:5d}  chain {chain * 1e3:9.1f} ms  {rows * steps / chain:10.1f} drafted tokens/s  "
          f"({rows / chain:.1f} start rows/s)")
    print(f"{'':9s} tree topk {args.topk}, {args.draft_tokens} tokens: {tree * 1e3:9.1f} ms = {tree / plain:.2f}x the "
          f"chain after the prefix pass; sampling at T=0.7: {sampled / plain:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256, help="rows of the Llama-8B-shaped replay")
    ap.add_argument("--layers", type=int, default=1, help="decoder layers of the Llama-8B-shaped drafter")
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--draft-tokens", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=("sample", "llama-8b"), default=None)
    args = ap.parse_args()
    print(f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, steps {args.steps}")
    runs = [("sample", lambda: sample(args.device)),
            ("llama-8b", lambda: llama8b(args.device, args.tokens, args.layers))]
    for name, build in runs:
        if args.only not in (None, name):
            continue
        measure(name, build(), args)


if __name__ == "__main__":
    main()
