"""Benchmark drafter replay: tokens drafted per second for the sample drafter and a Llama-8B-shaped drafter.

    python benchmarks/bench_replay.py                  # CPU: sample drafter, Llama-8B shape at T = 256
    python benchmarks/bench_replay.py --device cuda --tokens 2048

Throughput = start rows x draft steps / wall seconds of ``replay_drafts`` (the forward of every
step for every start row, chunked as the CLI runs it; target tokens and scoring excluded, they
cost one lm_head pass). Best of ``--repeat`` after one warm-up.

* sample: data_samples/drafter (H=128, 1 layer, draft vocab 256) on capture_sweep.safetensors
  (40 rows), fed the trained wiring p3,p7,p10;
* llama-8b: H=4096, 32 heads / 8 kv heads of 128, MLP 14336, draft vocabulary 32000 and, to keep
  the embedding small, a 32000-token target vocabulary (Llama-3-8B has 128256; the embedding is a
  gather, so only memory changes); random float32 weights, random aux states and ids.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eagleforensics.evidence.replay import DraftForward, replay_drafts
from eagleforensics.io.capture import load_capture
from eagleforensics.io.drafter import DrafterSpec, load_drafter
from eagleforensics.positions import Position


def _time(fn, repeat: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def sample(device: str, steps: int, repeat: int) -> tuple[int, float]:
    samples = ROOT / "data_samples"
    drafter = load_drafter(samples / "drafter", target=samples / "target")
    cap = load_capture(samples / "capture_sweep.safetensors")
    aux = torch.cat([cap.read(Position(p)).float() for p in (3, 7, 10)], -1)
    fwd = DraftForward.of(drafter, device)
    secs = _time(lambda: replay_drafts(fwd, aux, cap.input_ids, steps), repeat)
    return aux.shape[0], secs


def llama8b(device: str, steps: int, repeat: int, tokens: int) -> tuple[int, float]:
    h, vocab = 4096, 32000
    spec = DrafterSpec(path="synthetic", layout="specforge", hidden_size=h, target_hidden_size=h, num_heads=32,
                       num_kv_heads=8, head_dim=128, intermediate_size=14336, rms_norm_eps=1e-5, rope_theta=500000.0,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                       vocab_size=vocab, draft_vocab_size=32000, num_aux=3)
    gen = torch.Generator().manual_seed(0)

    def mat(o: int, i: int) -> torch.Tensor:
        return torch.randn(o, i, generator=gen) / i ** 0.5

    w = {"fc.weight": mat(h, 3 * h), "layer.self_attn.q_proj.weight": mat(4096, 2 * h),
         "layer.self_attn.k_proj.weight": mat(1024, 2 * h), "layer.self_attn.v_proj.weight": mat(1024, 2 * h),
         "layer.self_attn.o_proj.weight": mat(h, 4096), "layer.mlp.gate_proj.weight": mat(14336, h),
         "layer.mlp.up_proj.weight": mat(14336, h), "layer.mlp.down_proj.weight": mat(h, 14336),
         "lm_head.weight": mat(32000, h), "embed": torch.randn(vocab, h, generator=gen),
         "d2t": torch.zeros(32000, dtype=torch.long)}
    for name in ("layer.input_layernorm.weight", "layer.hidden_norm.weight", "layer.post_attention_layernorm.weight",
                 "norm.weight"):
        w[name] = torch.ones(h)
    fwd = DraftForward(spec, w, device)
    del w
    aux = torch.randn(tokens, 3 * h, generator=gen)
    ids = torch.randint(0, vocab, (tokens,), generator=gen)
    secs = _time(lambda: replay_drafts(fwd, aux, ids, steps), repeat)
    return tokens, secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256, help="rows of the Llama-8B-shaped replay")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=("sample", "llama-8b"), default=None)
    args = ap.parse_args()
    print(f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, steps {args.steps}")
    runs = [("sample", lambda: sample(args.device, args.steps, args.repeat)),
            ("llama-8b", lambda: llama8b(args.device, args.steps, args.repeat, args.tokens))]
    for name, run in runs:
        if args.only not in (None, name):
            continue
        rows, secs = run()
        print(f"{name:9s} rows {rows:5d}  {secs * 1e3:9.1f} ms  {rows * args.steps / secs:10.1f} drafted tokens/s  "
              f"({rows / secs:.1f} start rows/s)")


if __name__ == "__main__":
    main()
