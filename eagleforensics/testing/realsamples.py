"""Sequences, records and captures of the real target (``realtarget``), shared by the recipe, tests and benchmark.

``prompts`` writes the recipe's templated user prompts (no downloads: templates x subjects, in a seeded
order); ``generate_features`` has the target answer them greedily through its chat template and keeps the
EAGLE-3 features of the same passes; ``features`` runs one full forward over given sequences (and cuts an
answer where a token is not that forward's argmax); ``write_record`` writes a SpecForge-layout record (``input_ids``, ``loss_mask`` over the answer,
post-norm ``hidden_state``, ``aux_hidden_state`` at the given positions, bf16) from a real forward pass.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

from .chat import cache_kwargs

TEMPLATES = (
    "Explain {s} in two sentences.",
    "What is {s}? Answer briefly.",
    "Give me three facts about {s}.",
    "Write a short poem about {s}.",
    "Why does {s} matter to ordinary people?",
    "Describe {s} to a ten year old.",
    "List two advantages and two drawbacks of {s}.",
    "Write one sentence that a teacher could use to introduce {s}.",
    "How would you summarise {s} in a tweet?",
    "What is a common misunderstanding about {s}?",
    "Suggest a title for an essay on {s}.",
    "What question would you ask an expert on {s}?",
)
SUBJECTS = (
    "photosynthesis", "the water cycle", "gravity", "volcanoes", "the moon", "rainbows", "bees", "recycling",
    "the internet", "electric cars", "solar panels", "vaccines", "the human heart", "sleep", "coffee",
    "the Roman empire", "chess", "music lessons", "public libraries", "bicycles", "climate change", "earthquakes",
    "the stock market", "a healthy breakfast", "learning a language", "dinosaurs", "the ocean tides",
    "computer programming", "friendship", "the printing press", "honey", "trains", "mountains", "penguins",
    "the periodic table", "democracy", "gardening", "the speed of light", "snow", "bread baking",
)
SYSTEM_PROMPT_NOTE = "the template's default system prompt (no system message is passed)"


def prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct templated prompts in a seeded order (at most len(TEMPLATES) * len(SUBJECTS))."""
    every = [t.format(s=s) for s in SUBJECTS for t in TEMPLATES]
    if n > len(every):
        raise ValueError(f"at most {len(every)} prompts, asked for {n}")
    random.Random(seed).shuffle(every)
    return every[:n]


def chat_prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The served request's ids: the chat template with ``add_generation_prompt`` (a chat endpoint's rendering)."""
    out = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]


def _forward(model: Any, seqs: list[list[int]], pad: int, positions: tuple[int, ...] = ()
             ) -> tuple[torch.Tensor, dict[int, torch.Tensor], torch.Tensor]:
    """One right-padded batch forward: greedy next ids [B, T], states at ``positions`` (HF hidden_states index,
    raw) and the post-norm final state [B, T, H]."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    hs = out.hidden_states
    return out.logits.argmax(-1), {p: hs[p] for p in positions}, hs[-1]


def features(model: Any, seqs: list[tuple[list[int], int]], positions: tuple[int, ...], batch: int = 16
             ) -> list[dict[str, torch.Tensor]]:
    """Per sequence: ``ids``, ``loss_mask`` (the answer), ``y`` (target greedy next id per row), ``final``
    (post-norm, bf16) and ``p{n}`` states (raw, bf16) at ``positions``: one right-padded forward per batch.

    An answer is cut before its first token that is not the argmax of this forward (a near tie that batched
    generation's padding flipped): every kept answer token is the target's greedy choice here, and the rows
    kept are unchanged by the cut (causal attention)."""
    res = []
    for a in range(0, len(seqs), batch):
        chunk = seqs[a:a + batch]
        greedy, hs, final = _forward(model, [s for s, _ in chunk], 0, positions)
        for i, (s, p) in enumerate(chunk):
            t = len(s)
            want = greedy[i, p - 1:t - 1].tolist()
            cut = next((j for j, (x, y) in enumerate(zip(s[p:], want)) if x != y), None)
            if cut is not None:
                t = p + cut
            item = {"ids": torch.tensor(s[:t]), "loss_mask": torch.cat([torch.zeros(p), torch.ones(t - p)]).long(),
                    "y": greedy[i, :t].clone(), "final": final[i, :t].to(torch.bfloat16).clone(),
                    "prompt_tokens": p}
            item.update({f"p{q}": hs[q][i, :t].to(torch.bfloat16).clone() for q in positions})
            res.append(item)
    return res


def generate_features(model: Any, tokenizer: Any, texts: list[str], max_new: int, positions: tuple[int, ...]
                      ) -> list[dict[str, torch.Tensor]]:
    """The target's greedy answers to ``texts`` through its chat template and, from the same passes, what
    ``features`` gives (ids, loss_mask, y, final, ``p{n}``): one batch, left padding with its attention mask and
    position ids, a KV cache, each answer token the argmax of the pass that wrote it, up to and with
    ``<|im_end|>`` or ``max_new`` tokens. The answers' rows are not computed twice (the CPU budget of the recipe)."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    chunk = [chat_prompt_ids(tokenizer, t) for t in texts]
    width, b = max(len(c) for c in chunk), len(chunk)
    ids = torch.zeros((b, width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, c in enumerate(chunk):
        ids[i, width - len(c):] = torch.tensor(c)
        mask[i, width - len(c):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    keep: dict[str, list[torch.Tensor]] = {f"p{q}": [] for q in positions}
    keep["final"], keep["y"], keep["ids"] = [], [], []
    done = torch.zeros(b, dtype=torch.bool)
    length = torch.full((b,), max_new, dtype=torch.long)
    cache: dict[str, Any] = {}
    step_ids = ids
    with torch.no_grad():
        for step in range(max_new + 1):
            out = model(input_ids=step_ids, attention_mask=mask, position_ids=pos, use_cache=True,
                        output_hidden_states=True, **cache)
            cache = cache_kwargs(out)
            hs = out.hidden_states
            for q in positions:
                keep[f"p{q}"].append(hs[q].to(torch.bfloat16))
            keep["final"].append(hs[-1].to(torch.bfloat16))
            nxt = out.logits[:, -1:].argmax(-1) if step else out.logits.argmax(-1)
            keep["y"].append(nxt if step else nxt)
            keep["ids"].append(step_ids)
            nxt = nxt[:, -1:]
            if step == max_new:
                break
            newly = (nxt[:, 0] == eos) & ~done
            length[newly] = step + 1
            done |= newly
            if bool(done.all()):
                keep["ids"].append(nxt)
                out = model(input_ids=nxt, attention_mask=torch.cat([mask, torch.ones(b, 1, dtype=torch.long)], 1),
                            position_ids=pos[:, -1:] + 1, use_cache=True, output_hidden_states=True, **cache)
                for q in positions:
                    keep[f"p{q}"].append(out.hidden_states[q].to(torch.bfloat16))
                keep["final"].append(out.hidden_states[-1].to(torch.bfloat16))
                keep["y"].append(out.logits.argmax(-1))
                break
            step_ids = nxt
            mask = torch.cat([mask, torch.ones(b, 1, dtype=torch.long)], 1)
            pos = pos[:, -1:] + 1
    cat = {k: torch.cat(v, 1) for k, v in keep.items()}
    res = []
    for i, c in enumerate(chunk):
        p = len(c)
        t = p + int(length[i])
        rows = slice(width - p, width - p + t)
        item = {"ids": cat["ids"][i, rows].clone(), "y": cat["y"][i, rows].clone(),
                "loss_mask": torch.cat([torch.zeros(p), torch.ones(t - p)]).long(), "prompt_tokens": p,
                "final": cat["final"][i, rows].clone()}
        item.update({f"p{q}": cat[f"p{q}"][i, rows].clone() for q in positions})
        res.append(item)
    return res


def write_record(item: dict[str, torch.Tensor], positions: tuple[int, ...], path: Path) -> Path:
    """A SpecForge 0.2.0 ``data_*.ckpt`` record from ``features`` output: aux states at ``positions`` (bf16)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"input_ids": item["ids"].clone(), "loss_mask": item["loss_mask"].clone(),
                "hidden_state": item["final"].clone(),
                "aux_hidden_state": torch.cat([item[f"p{p}"] for p in positions], -1).contiguous()}, path)
    return path


def read_heldout(path: Path) -> list[dict[str, Any]]:
    """The recipe's held-out sequences (``data_samples/real/heldout.jsonl``): ids, prompt length, trainer figures."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
