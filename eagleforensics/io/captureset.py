"""A capture set: many sequences captured in one call (``capture --prompts``), one capture file per sequence.

``capture_many`` loads the model once, renders each request as the server would (``io.servedprompts``: a
chat request through the target's own chat template with the generation prompt, a text prompt as written,
token ids as given), runs the sequences in batches (right padding: causal attention keeps every real row
as it is alone; sorted by length so little is padded) and writes ``DIR/seq-NNNN.safetensors`` (the capture
helper's own format, one per request, in the file's order) plus ``DIR/captures.jsonl`` naming each file's
request line and token count. ``list_capture_set`` finds the files of such a directory for the commands
that pool (``replay``, ``doctor``): a directory whose safetensors files all carry the helper's metadata; a
directory of per-position files (one capture) is not one.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ForensicsError
from .capture import CAPTURE_FORMAT, META_KEY
from .formats import read_safetensors_header

INDEX_NAME = "captures.jsonl"
MAX_BATCH_TOKENS = 4096  # rows of one batched forward (batch x padded length): bounds the states held at once


def read_requests(path: str | Path) -> list[Any]:
    """The requests of ``path``: a JSONL file in ``doctor --served-prompts``' forms, or a text file holding one
    user message per line (sent as a chat request)."""
    from .guards import open_regular
    from .servedprompts import ServedPrompt, load_served_prompts

    p = Path(path)
    if p.suffix in (".jsonl", ".json"):
        prompts = load_served_prompts(p)
    else:
        with open_regular(p, "prompts file") as fh:
            text = fh.read().decode("utf-8", errors="replace")
        prompts = [ServedPrompt(n, messages=[{"role": "user", "content": line}], source=p)
                   for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not prompts:
        raise ForensicsError("holds no prompt", path=p)
    return prompts


def capture_many(model_dir: str | Path, prompts_file: str | Path, out_dir: str | Path, dtype: str = "float32",
                 max_batch_tokens: int = MAX_BATCH_TOKENS) -> tuple[Path, int, int]:
    """Capture every request of ``prompts_file`` into ``out_dir``: (directory, sequences, tokens)."""
    import torch

    from .sweep import _final_norm, load_local_model, write_capture
    from .tokenizer import load_tokenizer

    requests = read_requests(prompts_file)
    tok = load_tokenizer(model_dir) if any(r.ids is None for r in requests) else None  # ids need no tokenizer
    seqs = [list(r.ids) if r.ids is not None else r.token_ids(tok) for r in requests]
    for r, s in zip(requests, seqs):
        if not s:
            raise ForensicsError(f"line {r.line} renders to no tokens", path=prompts_file)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ForensicsError("exists and is not a directory (capture --prompts writes a directory)", path=out)
    model = load_local_model(model_dir)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    for r, s in zip(requests, seqs):
        if max(s) >= vocab:
            raise ForensicsError(f"line {r.line}: token id {max(s)} is outside the model's vocabulary of {vocab}",
                                 path=prompts_file)
    out.mkdir(parents=True, exist_ok=True)
    norm = _final_norm(model)
    base = getattr(model, "model", None)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    width = len(str(max(len(seqs) - 1, 1)))
    names = [f"seq-{i:0{max(4, width)}d}.safetensors" for i in range(len(seqs))]
    start = 0
    while start < len(order):  # batches of similar length, at most max_batch_tokens padded rows
        stop = start + 1
        while stop < len(order) and (stop - start + 1) * len(seqs[order[stop]]) <= max_batch_tokens:
            stop += 1
        batch = order[start:stop]
        longest = max(len(seqs[i]) for i in batch)
        ids = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, :len(seqs[i])] = torch.tensor(seqs[i])
        grabbed: dict[str, torch.Tensor] = {}

        def hook(_m: Any, args: tuple[Any, ...], output: torch.Tensor) -> None:
            grabbed["raw"], grabbed["normed"] = args[0].detach(), output.detach()

        handle = norm.register_forward_hook(hook)
        try:
            with torch.no_grad():  # the decoder alone when it can be reached: the lm_head's logits are not needed
                runner = base if base is not None else model
                hs = runner(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
        finally:
            handle.remove()
        n = len(hs) - 1
        for row, i in enumerate(batch):
            t = len(seqs[i])
            tensors = {f"hidden.{p}": hs[p][row, :t] for p in range(n)}
            tensors[f"hidden.{n}"] = grabbed["raw"][row, :t]
            tensors["final_norm"] = grabbed["normed"][row, :t]
            tensors["input_ids"] = ids[row, :t].clone()
            write_capture(out / names[i], tensors, model, dtype)
        start = stop
    with (out / INDEX_NAME).open("w") as fh:
        for r, s, name in zip(requests, seqs, names):
            fh.write(json.dumps({"file": name, "line": r.line, "kind": r.kind, "tokens": len(s)}) + "\n")
    return out, len(seqs), sum(len(s) for s in seqs)


def _is_own_capture(f: Path) -> bool:
    try:
        meta = read_safetensors_header(f).get("__metadata__") or {}
        return json.loads(meta.get(META_KEY, "{}")).get("format") == CAPTURE_FORMAT
    except (ForensicsError, OSError, ValueError, AttributeError):
        return False


def list_capture_set(path: str | Path) -> list[Path] | None:
    """The capture files of a capture set directory, sorted by name; None when ``path`` is not one (a file, or a
    directory of one capture's per-position files)."""
    p = Path(path)
    if not p.is_dir():
        return None
    files = sorted(f for f in p.iterdir() if f.suffix == ".safetensors" and f.is_file())
    if not files or not all(_is_own_capture(f) for f in files):
        return None
    return files
