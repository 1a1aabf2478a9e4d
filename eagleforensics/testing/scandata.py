"""A SpecForge-layout dataset with planted faults, built from real tiny-model forward passes.

Used by the scan tests, ``scripts/make_scan_dataset.py`` and demos. One batched forward pass
of a ``tinymodels`` Llama (N = 8, H = 128) over a few hundred prompts gives every hidden
state; each record takes one prompt cut to its own length (a causal model's states for a
prefix are the prefix of its states), so thousands of records take seconds. Every prompt
opens with the same short "system prompt", as chat-templated data does, and the reference
capture is a sweep of another prompt with that opening.

Records follow SpecForge's offline writer (docs/conventions.md, "What the
training data holds"): ``rows_{g}-{g+2000}/data_{idx}.ckpt`` (every tenth gzipped),
``input_ids [S]``, ``loss_mask [S]``, ``hidden_state [1,S,H]`` post-norm,
``aux_hidden_state [1,S,3H]`` at p = [2, N//2, N-3], right-padded with zero rows.

Planted faults, one record each unless ``plant`` says otherwise:

* ``nan``: one NaN row in aux slot 1 (SpecForge #104);
* ``embedding-layer``: aux slot 0 holds p = 0, the embedding (the wrong "fix" of data_samples);
* ``raw-final``: the final slot holds p = N before the norm (the trainer expects post-norm);
* ``off-by-one``: aux slot 1 holds p = N//2 + 1 (the SGLang/vLLM id shift); only the shared
  opening tokens compared with the reference can reveal it;
* ``shifted-padding``: the zero hidden rows start one row after the ids' padding;
* ``corrupt``: the file is cut short (an interrupted copy).
"""
from __future__ import annotations

import gzip
import io
from dataclasses import dataclass
from pathlib import Path

import torch

from ..io.sweep import forward_with_final
from .tinymodels import BOS_ID

NUM_LAYERS = 8
HIDDEN = 128
MAX_TOKENS = 32
SYSTEM_TOKENS = 8
PROMPTS = 128
ROWS_PER_DIR = 2000
PLANTS = ("nan", "embedding-layer", "raw-final", "off-by-one", "shifted-padding", "corrupt")
NEEDS_REFERENCE = ("off-by-one",)


@dataclass(frozen=True)
class Dataset:
    """Where the records and the reference went, and which records carry which planted fault."""

    root: Path
    reference: Path
    records: list[str]  # paths relative to root, in index order
    planted: dict[str, str]  # relative path -> fault name


def _forward(seed: int) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor, torch.nn.Module, torch.Tensor]:
    """One batched forward pass: prompt ids [P,S], states per position p=0..N (p=N raw), post-norm [P,S,H]."""
    from .tinymodels import build_model

    model = build_model("llama", num_layers=NUM_LAYERS, hidden=HIDDEN, seed=seed)
    gen = torch.Generator().manual_seed(seed + 11)
    vocab = model.config.vocab_size
    system = torch.randint(3, vocab, (SYSTEM_TOKENS,), generator=gen)
    system[0] = BOS_ID
    rest = torch.randint(3, vocab, (PROMPTS + 1, MAX_TOKENS - SYSTEM_TOKENS), generator=gen)
    ids = torch.cat([system.expand(PROMPTS + 1, -1), rest], dim=1)
    hs, raw, normed = forward_with_final(model, ids)
    states = [h.to(torch.bfloat16) for h in hs[:-1]] + [raw.to(torch.bfloat16)]
    return ids, states, normed.to(torch.bfloat16), model, ids[PROMPTS]


def _save(obj: dict[str, torch.Tensor], path: Path, gz: bool) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    path.write_bytes(gzip.compress(buf.getvalue(), compresslevel=1) if gz else buf.getvalue())


def make_dataset(
    out: str | Path, records: int = 2000, *, seed: int = 0, plant: dict[str, int] | None = None
) -> Dataset:
    """Write ``records`` SpecForge records under ``out/data`` and a reference capture ``out/reference.safetensors``."""
    from ..io.sweep import sweep, write_capture

    out = Path(out)
    root = out / "data"
    root.mkdir(parents=True, exist_ok=True)
    counts = {name: 1 for name in PLANTS} if plant is None else dict(plant)
    unknown = set(counts) - set(PLANTS)
    if unknown:
        raise ValueError(f"unknown planted faults {sorted(unknown)}; choose from {', '.join(PLANTS)}")
    ids, states, normed, model, ref_ids = _forward(seed)
    write_capture(out / "reference.safetensors", sweep(model, ref_ids), model)
    gen = torch.Generator().manual_seed(seed + 23)
    picks = torch.randperm(records, generator=gen).tolist()
    kinds: dict[int, str] = {}
    for name in PLANTS:
        for _ in range(counts.get(name, 0)):
            kinds[picks.pop()] = name
    aux_p = [2, NUM_LAYERS // 2, NUM_LAYERS - 3]
    rel: list[str] = []
    planted: dict[str, str] = {}
    for i in range(records):
        kind = kinds.get(i)
        j = int(torch.randint(PROMPTS, (1,), generator=gen))
        length = int(torch.randint(12, MAX_TOKENS + 1, (1,), generator=gen))
        if kind == "shifted-padding":
            length = min(length, MAX_TOKENS - 2)
        prompt = SYSTEM_TOKENS + int(torch.randint(2, 6, (1,), generator=gen))
        p = list(aux_p)
        if kind == "embedding-layer":
            p[0] = 0
        if kind == "off-by-one":
            p[1] += 1
        aux = torch.cat([states[k][j] for k in p], dim=-1).clone()
        final = (states[NUM_LAYERS][j] if kind == "raw-final" else normed[j]).clone()
        hidden_rows = length + 1 if kind == "shifted-padding" else length
        aux[hidden_rows:] = 0
        final[hidden_rows:] = 0
        if kind == "nan":
            aux[length // 2, HIDDEN:2 * HIDDEN] = float("nan")
        input_ids = ids[j].clone()
        input_ids[length:] = 0
        mask = torch.zeros(MAX_TOKENS, dtype=torch.int64)
        mask[prompt:length] = 1
        g = i // ROWS_PER_DIR * ROWS_PER_DIR
        name = f"rows_{g}-{g + ROWS_PER_DIR}/data_{i}.ckpt" + (".gz" if i % 10 == 9 else "")
        path = root / name
        path.parent.mkdir(exist_ok=True)
        _save({"input_ids": input_ids, "loss_mask": mask, "hidden_state": final[None],
               "aux_hidden_state": aux[None]}, path, gz=name.endswith(".gz"))
        if kind == "corrupt":
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2])
        rel.append(name)
        if kind is not None:
            planted[name] = kind
    return Dataset(root, out / "reference.safetensors", rel, planted)
