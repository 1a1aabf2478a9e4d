"""Train the tiny EAGLE-3 drafter in data_samples/drafter/ on the tiny target that made the samples (CPU, seconds).

The drafter is trained the way SpecForge trains one (test-time-training unroll of 3 steps, teacher
forcing with the sequence's ids, cross-entropy to the target's greedy token over a 256-token draft
vocabulary) on the OUTPUTS of layers 2, 6, 9 (positions 3, 7, 10): the wiring of
``record_layer_outputs.pt``, the incident's training data. Training sequences are the samples'
own 64-token sequence plus 127 random prompts (seeds 1000+): a random tiny target's greedy next
token follows no language, so a tiny drafter only predicts it well on text it has seen (the
script prints its step-1 acceptance on 8 held-out prompts too; README quotes both). What the
sample then shows is the incident's point: the same drafter, fed other positions, accepts less.
Deterministic: fixed seeds, one thread.

Writes (about 0.9 MB in all):
  data_samples/drafter/  config.json (SpecForge layout, ``eagle_config`` ids [2, 6, 9] for SGLang)
                         model.safetensors (bf16; fc, midlayer.*, norm, lm_head, d2t, t2d; no
                         embed_tokens: replay reads it from the target, as it must for drafters
                         that do not carry one)
  data_samples/target/   config.json, model.safetensors.index.json and two shards holding only the
                         target tensors replay reads (embedding, final norm, lm_head; float32)

    python scripts/train_drafter.py [OUT_DIR]
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_samples import PROMPT_TOKENS, RESPONSE_TOKENS, N, sample_ids, target_model

from eagleforensics.drafter.replay import DraftForward
from eagleforensics.io.drafter import DrafterSpec
from eagleforensics.testing.drafterbuild import frequency_vocab
from eagleforensics.testing.tinymodels import prompt_ids

TRAINED_POSITIONS = (3, N // 2 + 1, N - 2)  # outputs of layers 2, 6, 9: record_layer_outputs.pt
SGLANG_IDS = [p - 1 for p in TRAINED_POSITIONS]  # SGLang's Llama rule: id k captures p = k + 1
SEQUENCES = 128
SEQ_LEN = PROMPT_TOKENS + RESPONSE_TOKENS
DRAFT_VOCAB = 256
TTT_STEPS = 3
EPOCHS = 30
BATCH = 8
LR = 3e-3


def features(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [S, T], aux states at the trained positions [S, T, 3H] (bf16-rounded as dumped), target tokens [S, T]."""
    seqs = torch.stack([sample_ids()] + [prompt_ids(SEQ_LEN, seed=1000 + i) for i in range(SEQUENCES - 1)])
    with torch.no_grad():
        hs = model(seqs, output_hidden_states=True).hidden_states  # the last entry is post-norm
        aux = torch.cat([hs[p].to(torch.bfloat16).float() for p in TRAINED_POSITIONS], -1)
        targets = (hs[N] @ model.lm_head.weight.T).argmax(-1)
    return seqs, aux, targets



def spec(model: torch.nn.Module) -> DrafterSpec:
    cfg = model.config
    return DrafterSpec(path="", layout="specforge", hidden_size=cfg.hidden_size, target_hidden_size=cfg.hidden_size,
                       num_heads=4, num_kv_heads=2, head_dim=cfg.hidden_size // 4, intermediate_size=cfg.hidden_size,
                       rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, vocab_size=cfg.vocab_size,
                       draft_vocab_size=DRAFT_VOCAB, num_aux=3)


def init_weights(s: DrafterSpec, gen: torch.Generator) -> dict[str, torch.Tensor]:
    h, d = s.hidden_size, s.head_dim

    def lin(o: int, i: int) -> torch.Tensor:
        return (torch.randn(o, i, generator=gen) / i ** 0.5).requires_grad_()

    w = {"fc.weight": lin(h, 3 * h), "layer.self_attn.q_proj.weight": lin(s.num_heads * d, 2 * h),
         "layer.self_attn.k_proj.weight": lin(s.num_kv_heads * d, 2 * h),
         "layer.self_attn.v_proj.weight": lin(s.num_kv_heads * d, 2 * h),
         "layer.self_attn.o_proj.weight": lin(h, s.num_heads * d), "layer.mlp.gate_proj.weight": lin(s.intermediate_size, h),
         "layer.mlp.up_proj.weight": lin(s.intermediate_size, h), "layer.mlp.down_proj.weight": lin(h, s.intermediate_size),
         "lm_head.weight": lin(s.draft_vocab_size, h)}
    for name in ("layer.input_layernorm.weight", "layer.hidden_norm.weight", "layer.post_attention_layernorm.weight",
                 "norm.weight"):
        w[name] = torch.ones(h, requires_grad=True)
    return w


def train(model: torch.nn.Module) -> tuple[DrafterSpec, dict[str, torch.Tensor], float]:
    seqs, aux, targets = features(model)
    keep, d2t, t2d = frequency_vocab(targets, model.config.vocab_size, DRAFT_VOCAB)
    to_draft = torch.full((model.config.vocab_size,), -100, dtype=torch.long)
    to_draft[keep] = torch.arange(DRAFT_VOCAB)
    labels = to_draft[targets]  # -100 where the target's token is outside the draft vocabulary
    s = spec(model)
    gen = torch.Generator().manual_seed(0)
    w = init_weights(s, gen)
    frozen = {"embed": model.model.embed_tokens.weight.detach().clone()}
    opt = torch.optim.AdamW(list(w.values()), lr=LR, weight_decay=0.0)
    total = EPOCHS * (SEQUENCES // BATCH)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=total, pct_start=0.1)
    start = time.perf_counter()
    pos = torch.arange(SEQ_LEN).repeat(BATCH)
    doc = torch.arange(BATCH).repeat_interleave(SEQ_LEN)
    for epoch in range(EPOCHS):
        order = torch.randperm(SEQUENCES, generator=gen)
        for i in range(0, SEQUENCES, BATCH):
            pick = order[i:i + BATCH]
            ids, feats = seqs[pick].flatten(), aux[pick].flatten(0, 1)
            fwd = DraftForward(s, {**w, **frozen})
            h0 = fwd.project(feats)
            pre = fwd.prefix(h0, ids, chunk=ids.shape[0], pos=pos, doc=doc)
            loss = torch.zeros(())
            for k, logits in enumerate(fwd.chain(pre, TTT_STEPS, 0, ids.shape[0]), start=1):
                # step k at row t predicts the target's token at t+k of the same sequence
                y = torch.cat([labels[pick][:, k:], labels.new_full((len(pick), k), -100)], 1).flatten()
                loss = loss + 0.8 ** (k - 1) * F.cross_entropy(logits, y, ignore_index=-100)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        print(f"epoch {epoch + 1}/{EPOCHS}: loss {loss.item():.3f}", flush=True)
    seconds = time.perf_counter() - start
    out = {k: v.detach() for k, v in w.items()}
    out["d2t"], out["t2d"] = d2t, t2d
    return s, out, seconds


def write_drafter(d: Path, s: DrafterSpec, w: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": s.hidden_size,
           "num_attention_heads": s.num_heads, "num_key_value_heads": s.num_kv_heads, "head_dim": s.head_dim,
           "intermediate_size": s.intermediate_size, "num_hidden_layers": 1, "hidden_act": "silu",
           "rms_norm_eps": s.rms_norm_eps, "rope_theta": s.rope_theta, "max_position_embeddings": 512,
           "vocab_size": s.vocab_size, "draft_vocab_size": s.draft_vocab_size, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "eagle_config": {"eagle_aux_hidden_state_layer_ids": SGLANG_IDS}}
    (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    stored = {}
    for name, t in w.items():
        key = name.replace("layer.", "midlayer.", 1) if name.startswith("layer.") else name
        stored[key] = t.to(torch.bfloat16).contiguous() if t.is_floating_point() else t.contiguous()
    save_file(dict(sorted(stored.items())), str(d / "model.safetensors"), metadata={"format": "pt"})


def write_target(d: Path, model: torch.nn.Module) -> None:
    """The slice of the target that replay reads, laid out as a sharded HF checkpoint."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = {k: v for k, v in model.config.to_dict().items() if k != "transformers_version"}
    (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True, default=str) + "\n")
    shards = {"model-00001-of-00002.safetensors": {"model.embed_tokens.weight": model.model.embed_tokens.weight,
                                                   "model.norm.weight": model.model.norm.weight},
              "model-00002-of-00002.safetensors": {"lm_head.weight": model.lm_head.weight}}
    wmap = {}
    for fname, tensors in shards.items():
        save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(d / fname), metadata={"format": "pt"})
        wmap.update({k: fname for k in tensors})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"note": "embedding, final norm and lm_head "
                                                                              "only"}, "weight_map": wmap},
                                                               indent=2, sort_keys=True) + "\n")


def held_out(model: torch.nn.Module, s: DrafterSpec, w: dict[str, torch.Tensor]) -> None:
    """Print step-1 acceptance on 8 prompts the drafter never saw, per wiring (the README quotes it)."""
    from eagleforensics.drafter.replay import replay_drafts

    fwd = DraftForward(s, {**w, "embed": model.model.embed_tokens.weight.detach()})
    seqs = torch.stack([prompt_ids(SEQ_LEN, seed=5000 + i) for i in range(8)])
    with torch.no_grad():
        hs = model(seqs, output_hidden_states=True).hidden_states
        y = (hs[N] @ model.lm_head.weight.T).argmax(-1)
    for wiring in (TRAINED_POSITIONS, (2, N // 2, N - 3), (0, 2, N // 2)):
        hits = [float((replay_drafts(fwd, torch.cat([hs[p][i] for p in wiring], -1), seqs[i], 1)[0, :-1]
                       == y[i, 1:]).float().mean()) for i in range(len(seqs))]
        print(f"held-out step-1 acceptance, wiring p{wiring}: {sum(hits) / len(hits):.3f}")


def main(out: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = target_model()
    s, w, seconds = train(model)
    held_out(model, s, w)
    write_drafter(out / "drafter", s, w, model)
    write_target(out / "target", model)
    print(f"trained in {seconds:.1f} s on CPU; wrote {out / 'drafter'} and {out / 'target'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "data_samples")
