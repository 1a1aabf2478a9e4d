"""Hold replay's acc@k against SpecForge's own acc_k, on held-out records of a drafter SpecForge's forward trained.

SpecForge is not a dependency of eagleforensics; install it apart (no deps, CPU is enough) and point
``--specforge-path`` at it (those are what the modules used here import beyond eagleforensics' own
dependencies; torch and transformers come from this environment):

    pip install --no-deps --target /tmp/sfenv specforge==0.2.0 triton datasets multiprocess pyarrow dill xxhash
    python scripts/specforge_crosscheck.py --specforge-path /tmp/sfenv [--out tests/fixtures/specforge]

What runs from SpecForge 0.2.0, unmodified: the draft model (``modeling/draft/llama3_eagle.py``
``LlamaForCausalLMEagle3``, sdpa attention), its training forward (``algorithms/eagle3/model.py``
``OnlineEagle3Model``, TTT length 7) through ``training/strategies/base.py`` ``Eagle3TrainStrategy``
(the 0.8-per-step loss weights, the frozen ``TargetHead`` over the stored final state), the offline
record normaliser (``algorithms/eagle3/data.py``) and the draft vocabulary map
(``data/preprocessing.py`` ``process_token_dict_to_mappings``). Two CPU accommodations:
``torch.compile`` is disabled (``TORCHDYNAMO_DISABLE=1``, SpecForge's compiled functions run eagerly)
and its Triton ``LogSoftmaxLoss`` is replaced by the reference implementation in the same file
(``core/loss.py`` ``_compute_loss``); the target head runs in float32. Nothing of SpecForge's is
copied into eagleforensics: only the figures it produced are stored.

The data: a tiny Llama target (N = 8, H = 64, random weights with undamped layer writes, so the next
token depends on the context and the wiring matters; ``testing.tinymodels``) writes the
response of each sequence itself (12 random prompt tokens, then 36 greedy tokens), as regenerated
training data is; the loss mask covers the response. The drafter is trained on positions
p3, p5, p6 (outputs of layers 2, 4, 5: one layer deeper than the engines' default) of 96 sequences;
6 held-out sequences give the figures. SpecForge's acc_k is computed on each held-out record for the
trained wiring and for two wrong ones (the engine default p2, p4, p5 and p0, p2, p4): the record's
aux states replaced by those positions. Replay reads the same files: the drafter directory, the
capture sweep of each held-out sequence (bf16, no input_ids: the tokens come from the record) and the
record itself (``--train``: its loss mask). The figures SpecForge produced go to
``specforge_acc.json``; ``tests/test_replay_specforge.py`` holds replay to them without SpecForge.
Deterministic on one CPU (fixed seeds, one thread); ~2-4 minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # SpecForge's @torch.compile functions run eagerly on CPU

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eagleforensics.io.sweep import sweep, write_capture  # noqa: E402
from eagleforensics.testing.tinymodels import build_model, prompt_ids  # noqa: E402

N, HIDDEN, VOCAB, DRAFT_VOCAB = 8, 64, 512, 256
PROMPT, RESPONSE = 12, 36
TRAIN_SEQS, HELD_OUT = 96, 6
TTT = 7
EPOCHS, LR = 12, 2e-3
TRAINED = (3, 5, 6)  # outputs of layers 2, 4, 5
WIRINGS = {"p3,p5,p6": TRAINED, "p2,p4,p5": (2, N // 2, N - 3), "p0,p2,p4": (0, 2, N // 2)}
TARGET_SEED = 3
DAMPING = 1.0  # undamped layer writes: the next token depends on the context, so the wiring matters


def target() -> torch.nn.Module:
    return build_model("llama", num_layers=N, hidden=HIDDEN, vocab=VOCAB, seed=TARGET_SEED, damping=DAMPING)


def generate(model: torch.nn.Module, seed: int) -> torch.Tensor:
    """12 prompt tokens, then the target's own greedy continuation of 36 tokens (no stop token)."""
    ids = prompt_ids(PROMPT, seed=seed, vocab=VOCAB)
    with torch.no_grad():
        for _ in range(RESPONSE):
            nxt = model(ids[None]).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt[None]])
    return ids


def record(hs: tuple[torch.Tensor, ...], ids: torch.Tensor, wiring: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """A SpecForge offline record (``input_ids``, ``loss_mask``, post-norm ``hidden_state``, ``aux_hidden_state``), bf16."""
    mask = torch.cat([torch.zeros(PROMPT), torch.ones(RESPONSE)]).long()
    return {"input_ids": ids.clone(), "loss_mask": mask,
            "hidden_state": hs[N][None].to(torch.bfloat16).contiguous(),
            "aux_hidden_state": torch.cat([hs[p] for p in wiring], -1)[None].to(torch.bfloat16).contiguous()}


def specforge_parts(sf_path: str) -> dict:
    """SpecForge's classes, with its Triton loss swapped for the reference loss of the same file."""
    sys.path.append(sf_path)
    import specforge.algorithms.eagle3.model as eagle3
    from specforge.algorithms.eagle3.data import normalize_offline_sample
    from specforge.core import loss as sf_loss
    from specforge.data.preprocessing import process_token_dict_to_mappings
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from specforge.modeling.target.target_head import TargetHead
    from specforge.runtime.contracts import TrainBatch
    from specforge.training.strategies.base import Eagle3TrainStrategy

    class ReferenceLoss:  # LogSoftmaxLoss.apply(logits, target_p, position_mask), computed by _compute_loss
        @staticmethod
        def apply(logits: torch.Tensor, target_p: torch.Tensor, position_mask: torch.Tensor) -> torch.Tensor:
            return sf_loss._compute_loss(logits, target_p, position_mask)

    eagle3.LogSoftmaxLoss = ReferenceLoss
    return {"model": eagle3.OnlineEagle3Model, "draft": LlamaForCausalLMEagle3, "head": TargetHead,
            "strategy": Eagle3TrainStrategy, "batch": TrainBatch, "normalize": normalize_offline_sample,
            "vocab": process_token_dict_to_mappings}


def draft_config(model: torch.nn.Module):
    from transformers import LlamaConfig

    t = model.config
    cfg = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=4, num_key_value_heads=2, head_dim=HIDDEN // 4,
                      intermediate_size=2 * HIDDEN, vocab_size=VOCAB, max_position_embeddings=t.max_position_embeddings,
                      rms_norm_eps=t.rms_norm_eps, num_hidden_layers=1, tie_word_embeddings=False, hidden_act="silu",
                      pad_token_id=0)
    cfg.draft_vocab_size = DRAFT_VOCAB
    return cfg


def write_target(d: Path, model: torch.nn.Module) -> None:
    """The target slice replay and SpecForge's TargetHead read (bf16), sharded with an index as a HF checkpoint is."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = {k: v for k, v in model.config.to_dict().items() if k != "transformers_version"}
    (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True, default=str) + "\n")
    tensors = {"model.embed_tokens.weight": model.model.embed_tokens.weight, "model.norm.weight": model.model.norm.weight,
               "lm_head.weight": model.lm_head.weight}
    save_file({k: v.detach().to(torch.bfloat16).contiguous() for k, v in tensors.items()},
              str(d / "model-00001-of-00001.safetensors"), metadata={"format": "pt"})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "model-00001-of-00001.safetensors" for k in tensors}}, indent=2,
        sort_keys=True) + "\n")


def write_drafter(d: Path, draft: torch.nn.Module, cfg) -> None:
    """SpecForge's own state_dict names, bf16, without the frozen embedding (as its checkpoint filter leaves it)."""
    d.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in draft.state_dict().items() if "embed" not in k}
    state = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items()}
    save_file(dict(sorted(state.items())), str(d / "model.safetensors"), metadata={"format": "pt"})
    out = {k: v for k, v in cfg.to_dict().items() if k != "transformers_version"}
    out.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=DRAFT_VOCAB, torch_dtype="bfloat16",
               eagle_config={"eagle_aux_hidden_state_layer_ids": [p - 1 for p in TRAINED]})
    (d / "config.json").write_text(json.dumps(out, indent=2, sort_keys=True, default=str) + "\n")


def batch(sf: dict, raw: dict[str, torch.Tensor]):
    sample = sf["normalize"](raw, max_len=PROMPT + RESPONSE)
    sample = {k: v.float() if v.is_floating_point() else v for k, v in sample.items()}  # bf16 values, float32 compute
    return sf["batch"](sample_ids=["x"], strategy="eagle3", tensors=sample, metadata={"target_repr": "hidden_state"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specforge-path", required=True, help="directory holding the specforge package (and triton)")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "specforge")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    sf = specforge_parts(args.specforge_path)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model = target()
    start = time.perf_counter()
    seqs = [generate(model, 2000 + i) for i in range(TRAIN_SEQS + HELD_OUT)]
    with torch.no_grad():
        states = [model(s[None], output_hidden_states=True).hidden_states for s in seqs]
    states = [tuple(h[0] for h in hs) for hs in states]
    print(f"generated {len(seqs)} sequences in {time.perf_counter() - start:.1f} s; distinct response tokens "
          f"{len({int(t) for s in seqs for t in s[PROMPT:]})}")
    write_target(out / "target", model)
    # SpecForge's own pieces: vocabulary map over the supervised tokens, draft model, frozen target head
    counts = Counter(int(t) for s in seqs[:TRAIN_SEQS] for t in s[PROMPT:])
    d2t, t2d = sf["vocab"](counts, DRAFT_VOCAB, VOCAB)
    cfg = draft_config(model)
    draft = sf["draft"](cfg, attention_backend="sdpa").float()
    with torch.no_grad():
        draft.d2t.copy_(d2t)
        draft.t2d.copy_(t2d)
        draft.embed_tokens.weight.copy_(model.model.embed_tokens.weight.to(torch.bfloat16).float())
    draft.embed_tokens.weight.requires_grad_(False)
    head = sf["head"].from_pretrained(str(out / "target")).float()
    online = sf["model"](draft, length=TTT, attention_backend="sdpa")
    strategy = sf["strategy"](online, target_head=head)
    params = [p for p in online.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=EPOCHS * TRAIN_SEQS, pct_start=0.1)
    train = [batch(sf, record(states[i], seqs[i], TRAINED)) for i in range(TRAIN_SEQS)]
    gen = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for epoch in range(EPOCHS):
        losses, accs = [], []
        for i in torch.randperm(TRAIN_SEQS, generator=gen).tolist():
            res = strategy.forward_loss(train[i])
            opt.zero_grad()
            res.loss.backward()
            opt.step()
            sched.step()
            losses.append(float(res.loss))
            accs.append(float(res.metrics["acces"][0]))
        print(f"epoch {epoch + 1}/{EPOCHS}: loss {sum(losses) / len(losses):.3f}, acc_0 {sum(accs) / len(accs):.3f}",
              flush=True)
    print(f"trained in {time.perf_counter() - start:.1f} s")
    write_drafter(out / "drafter", draft, cfg)
    # evaluate exactly the weights replay reads: the exported bf16 values, in float32
    from safetensors.torch import load_file
    stored = load_file(str(out / "drafter" / "model.safetensors"))
    with torch.no_grad():
        for k, v in draft.state_dict().items():
            if k in stored:
                v.copy_(stored[k].to(v.dtype))
    online.eval()
    figures: dict = {"specforge": "0.2.0", "torch": torch.__version__, "ttt_length": TTT, "trained": "p3,p5,p6",
                     "records": [], "wirings": {}}
    for j in range(HELD_OUT):
        i = TRAIN_SEQS + j
        name = f"heldout_{j}"
        torch.save(record(states[i], seqs[i], TRAINED), out / f"{name}.ckpt")
        cap = {k: v for k, v in sweep(model, seqs[i]).items() if k != "input_ids"}  # the tokens: from the record
        write_capture(out / f"{name}.safetensors", cap, model, dtype="bfloat16")
        figures["records"].append(name)
        for label, wiring in WIRINGS.items():
            with torch.no_grad():
                res = strategy.forward_loss(batch(sf, record(states[i], seqs[i], wiring)))
            m = res.metrics
            per = figures["wirings"].setdefault(label, {"correct": [], "denominator": [], "acceptance_rate": []})
            per["correct"].append([int(round(float(c))) for c in m["acc_corrects"]])
            per["denominator"].append([int(round(float(d))) for d in m["acc_denoms"]])
            per["acceptance_rate"].append([float(a) for a in m["acceptance_rates"]])
    for label, per in figures["wirings"].items():
        per["acc"] = [sum(c[k] for c in per["correct"]) / sum(d[k] for d in per["denominator"]) for k in range(TTT)]
    (out / "specforge_acc.json").write_text(json.dumps(figures, indent=1) + "\n")
    compare(out, figures)


def replay_acceptance_rate(out: Path, name: str, label: str) -> list[float]:
    """Replay's expected acceptance of drafts sampled from the drafter at temperature 1 (sum of min(p, q)), averaged
    over the rows SpecForge's ``acceptance_rate`` averages: loss_mask[t+k-1] = 1 and the target's token in the draft
    vocabulary. Reads the record (ids, mask, final state) and the capture (the wiring's states), nothing else."""
    from eagleforensics.arrays import to_torch
    from eagleforensics.drafter.replay import DraftForward, TargetSide, counted_rows, replay_chain, target_tokens
    from eagleforensics.io.capture import load_capture
    from eagleforensics.io.drafter import load_drafter, load_target
    from eagleforensics.positions import Position
    from eagleforensics.replay import parse_wiring

    rec = torch.load(out / f"{name}.ckpt")
    cap = load_capture(out / f"{name}.safetensors")
    drafter = load_drafter(out / "drafter", target=out / "target")
    head = load_target(out / "target")
    fwd = DraftForward.of(drafter)
    final = rec["hidden_state"][0].float()
    aux = torch.cat([to_torch(cap.read(Position(p.p))).float() for p in parse_wiring(label)], -1)
    ids, mask = rec["input_ids"], rec["loss_mask"]
    y = target_tokens(final, head.lm_head)
    h0, valid = fwd.project_rows(aux, len(ids))
    pre = fwd.prefix(h0, ids)
    run = replay_chain(fwd, pre, TTT, target=TargetSide(lambda a, b: final[a:b], len(ids), head.lm_head),
                       temperature=1.0)
    rows = counted_rows(len(ids), TTT, y, valid, mask)
    in_vocab = drafter.weights["t2d"].bool()
    out_rates = []
    for k in range(1, TTT + 1):
        ahead = torch.cat([y[k:], y.new_full((k,), -1)])
        where = rows.acc[k - 1] & (ahead >= 0) & in_vocab[ahead.clamp(min=0)]
        out_rates.append(float(run.alpha_sampled[k - 1][where].double().mean()))
    return out_rates


def compare(out: Path, figures: dict) -> None:
    """Replay on the same files, pooled over the held-out records, beside SpecForge's acc_k (and its
    acceptance_rate, the T=1 expected acceptance of sampled drafts, record by record)."""
    from eagleforensics.replay import run_replay

    print(f"\n{'wiring':10s} {'step':>4s} {'SpecForge acc_k':>16s} {'replay acc@k':>13s} {'diff':>7s}")
    for label in WIRINGS:
        correct = [0.0] * TTT
        counted = [0] * TTT
        for name in figures["records"]:
            rep = run_replay(out / "drafter", out / f"{name}.safetensors", target=out / "target",
                             train=out / f"{name}.ckpt", wirings=[label], steps=TTT)
            r = next(r for r in rep.results if r.label == label)
            for k in range(TTT):
                counted[k] += r.acc_rows[k]
                correct[k] += (r.acc[k] or 0.0) * r.acc_rows[k]
        for k in range(TTT):
            ours = correct[k] / counted[k]
            theirs = figures["wirings"][label]["acc"][k]
            print(f"{label:10s} {k:4d} {theirs:16.4f} {ours:13.4f} {ours - theirs:+7.4f}")
    worst = 0.0
    for label in WIRINGS:
        for j, name in enumerate(figures["records"]):
            ours = replay_acceptance_rate(out, name, label)
            theirs = figures["wirings"][label]["acceptance_rate"][j]
            worst = max(worst, max(abs(a - b) for a, b in zip(ours, theirs)))
    print(f"\nexpected acceptance of sampled drafts at T=1 (SpecForge acceptance_rate vs replay, "
          f"{len(WIRINGS)} wirings x {len(figures['records'])} records x {TTT} steps): max |diff| {worst:.2e}")


if __name__ == "__main__":
    main()
