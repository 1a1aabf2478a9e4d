"""Small chat tokenizers and templated training records for tests, scripts and demos (not the product).

``write_tokenizer(DIR, template)`` trains a byte-level BPE with the ``tokenizers`` library (vocabulary
512, the size of the ``tinymodels`` models) on English text and writes ``tokenizer.json`` and
``tokenizer_config.json`` with one of two chat templates written here in the style of the public
ones: ``chatml`` (Qwen3's structure: ``<|im_start|>role\\n...<|im_end|>\\n``, the last answer inside
``<think>...</think>``, an empty think block when it has no reasoning, ``enable_thinking=false``
writing that empty block into the generation prompt) and ``llama3`` (Llama 3's
``<|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>``). The vocabulary holds both
families' control tokens, as the tokenizer of a Llama-3-based distill of a ChatML model would, so a
record rendered with the "wrong" template still tokenizes into control tokens.

``render_record`` renders a conversation and builds its ``loss_mask`` the way the trainers do:
``specforge`` marks the answer text from right after the assistant header through the end-of-turn
token (sgl-project/SpecForge ``data/parse.py``: the assistant pattern's group includes the
end-of-turn token); ``speculators`` marks everything after the generation prompt of the same
conversation (vllm-project/speculators 0.9.0 ``data_generation/preprocessing.py``,
``_render_boundary_rows``). ``shift`` moves the mask by whole tokens (the SpecForge#885 kind of bug).
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..io.sweep import forward_with_final


def cache_kwargs(out: Any) -> dict[str, Any]:
    """The key-value cache of a forward's output, as the next call takes it: ``cache=`` where transformers
    returns one under that name (5.24 deprecates ``past_key_values``, to go in 5.40), else ``past_key_values=``."""
    state = out.get("cache")
    return {"cache": state} if state is not None else {"past_key_values": out.past_key_values}

CHATML_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
LLAMA3_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
VOCAB = 512

CHATML_TEMPLATE = """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning = message.reasoning_content %}
        {%- endif %}
        {%- if loop.index0 > ns.last_user %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + message.content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + message.content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

LLAMA3_TEMPLATE = """{{- bos_token }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}"""

TEMPLATES = {"chatml": CHATML_TEMPLATE, "llama3": LLAMA3_TEMPLATE}
HEADERS = {"chatml": "<|im_start|>assistant\n", "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n"}
END_OF_TURN = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>"}


def english_text(chars: int | None = None) -> str:
    """English prose: the docstrings of the Python standard library's top-level modules, in file order (about 780 KB
    in all; the same text on every machine with the same Python minor version; nothing downloaded). ``chars``: stop
    once that many characters are collected (parsing every module takes seconds)."""
    return _english_text(chars)


@lru_cache(maxsize=4)
def _english_text(chars: int | None) -> str:
    import ast
    import sysconfig

    docs: list[str] = []
    total = 0
    for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(p.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 80:
                    docs.append(" ".join(doc.split()))
                    total += len(docs[-1]) + 1
        if chars is not None and total >= chars:
            break
    text = "\n".join(docs)
    return text if chars is None else text[:chars]


@lru_cache(maxsize=2)
def _tokenizer_json(chars: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    chat = ("user assistant system Probe question answer reasoning text\n" * 200)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=CHATML_TOKENS + LLAMA3_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([english_text(chars), chat], trainer)
    # <think> and </think> are added but not "special" in Qwen3's tokenizer: decoding keeps them
    return tok.to_str()


def write_tokenizer(out: str | Path, template: str = "chatml", *, chars: int = 60_000) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (with ``template``'s chat template) into ``out``."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {', '.join(TEMPLATES)}")
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(_tokenizer_json(chars))
    specials = ({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"} if template == "chatml"
                else {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|end_of_text|>"})
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096, **specials,
           "chat_template": TEMPLATES[template]}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return d


def load(out: str | Path) -> Any:
    """The tokenizer written by ``write_tokenizer`` as the product reads it (``io.tokenizer.ChatTokenizer``)."""
    from ..io.tokenizer import load_tokenizer

    return load_tokenizer(out)


def _char_to_token(offsets: list[tuple[int, int]], char: int) -> int:
    """The index of the first token that starts at or after ``char``."""
    return next((k for k, (s, _e) in enumerate(offsets) if s >= char), len(offsets))


def render_record(tok: Any, messages: list[dict[str, Any]], *, style: str = "specforge", template: str = "chatml",
                  enable_thinking: bool | None = None, shift: int = 0) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of a conversation ending with an assistant turn, masked as ``style`` does.

    ``template`` names the family the conversation is rendered with (its header and end of turn); the
    tokenizer's own chat template is used (``tok.render``), so a tokenizer written with another template
    renders the other family.
    """
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    text = tok.render(messages, add_generation_prompt=False, **kwargs)
    enc = tok.tokenizer.encode(text, add_special_tokens=False)
    ids, offsets = list(enc.ids), list(enc.offsets)
    mask = [0] * len(ids)
    if style == "specforge":
        header, eot = HEADERS[template], END_OF_TURN[template]
        for m in re.finditer(re.escape(header) + r"([\s\S]*?(?:" + re.escape(eot) + "|$))", text):
            a, b = _char_to_token(offsets, m.start(1)), _char_to_token(offsets, m.end(1))
            for k in range(a, b):
                mask[k] = 1
    elif style == "speculators":
        prompt = tok.render(messages[:-1], add_generation_prompt=True, **kwargs)
        p_ids = tok.encode(prompt)
        boundary = len(p_ids) if ids[:len(p_ids)] == p_ids else next(
            k for k, (x, y) in enumerate(zip(ids, p_ids)) if x != y)
        mask = [0] * boundary + [1] * (len(ids) - boundary)
    else:
        raise ValueError(f"unknown style {style!r}; choose specforge or speculators")
    if shift:
        mask = ([0] * shift + mask[:-shift]) if shift > 0 else (mask[-shift:] + [0] * -shift)
    return ids, mask


# ---------------------------------------------------------------------- targets and records from real forward passes

def write_target(out: str | Path, model: Any, template: str = "chatml") -> Path:
    """A target directory: the model's config.json and model.safetensors (transformers' own writer) and the tokenizer."""
    d = Path(out)
    model.save_pretrained(d, safe_serialization=True)
    write_tokenizer(d, template)
    return d


def sharpen(model: Any, gain: float) -> Any:
    """Scale the lm_head so a random model's next-token distributions are peaked like a trained model's (in place)."""
    import torch

    with torch.no_grad():
        model.lm_head.weight.mul_(gain)
    return model


def generate(model: Any, prompts: list[list[int]], new: int, *, temperature: float = 0.0, seed: int = 0,
             stop: int | None = None, logit_noise: float = 0.0) -> list[list[int]]:
    """Continue each prompt by ``new`` tokens, greedy (temperature 0) or sampled at ``temperature`` (full softmax,
    no top-k/top-p), with the KV cache; prompts of one length run as one batch. A continuation is cut after
    ``stop`` when the model writes it. ``logit_noise``: Gaussian noise of that std added to the logits before the
    choice, as kernels other than the scorer's (batch-dependent reductions) break near-ties otherwise."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    out: list[list[int]] = [[] for _ in prompts]
    with torch.no_grad():
        for idx in groups.values():
            step = torch.tensor([prompts[i] for i in idx])
            cache: dict[str, Any] = {}
            made = []
            for _ in range(new):
                res = model(step, use_cache=True, **cache)
                cache = cache_kwargs(res)
                logits = res.logits[:, -1].double()
                if logit_noise > 0:
                    logits = logits + logit_noise * torch.randn(logits.shape, generator=gen, dtype=logits.dtype)
                if temperature <= 0:
                    t = logits.argmax(-1)
                else:
                    t = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)[:, 0]
                made.append(t)
                step = t[:, None]
            seqs = torch.stack(made, 1).tolist()
            for i, seq in zip(idx, seqs):
                if stop is not None and stop in seq:
                    seq = seq[:seq.index(stop) + 1]
                out[i] = seq
    return out


def specforge_record(model: Any, ids: list[int], mask: list[int], *, raw_final: bool = False,
                     pad_to: int | None = None) -> dict[str, Any]:
    """A SpecForge-layout record of ``ids`` from one forward pass of ``model``: ``input_ids``, ``loss_mask``, the
    post-norm final ``hidden_state`` (raw p = N with ``raw_final``, as speculators stores it) and three aux states,
    bf16 as SpecForge writes them; right-padded with zeros to ``pad_to``."""
    import torch

    hs, raw, normed = forward_with_final(model, torch.tensor([ids]))
    n = model.config.num_hidden_layers
    final = raw if raw_final else normed
    aux = torch.cat([hs[p] for p in (2, n // 2, n - 3)], dim=-1)
    rec = {"input_ids": torch.tensor(ids), "loss_mask": torch.tensor(mask),
           "hidden_state": final.to(torch.bfloat16), "aux_hidden_state": aux.to(torch.bfloat16)}
    if pad_to is not None and pad_to > len(ids):
        extra = pad_to - len(ids)
        rec["input_ids"] = torch.cat([rec["input_ids"], torch.zeros(extra, dtype=torch.long)])
        rec["loss_mask"] = torch.cat([rec["loss_mask"], torch.zeros(extra, dtype=torch.long)])
        for k in ("hidden_state", "aux_hidden_state"):
            t = rec[k]
            rec[k] = torch.cat([t, torch.zeros(1, extra, t.shape[-1], dtype=t.dtype)], dim=1)
    return rec


# ---------------------------------------------------------------------- a dataset for the audit (scan, demos, benchmark)

AUDIT_PLANTS = ("human", "other-model", "shifted-mask", "llama3-template")


def make_audit_dataset(out: str | Path, records: int = 2000, *, seed: int = 0, plant: dict[str, int] | None = None,
                       answer: int = 32, passage: int = 24) -> tuple[Path, Path, dict[str, str]]:
    """A chat target (``out/target``: a sharpened tiny Llama and a ChatML tokenizer) and ``records`` SpecForge
    records under ``out/data`` whose answers the target generated greedily (non-thinking: the empty think block
    before each answer), each from one real forward pass. Planted, ``plant`` records each (default 3): ``human``
    (English text as the answer), ``other-model`` (another model's answer), ``shifted-mask`` (the loss mask one
    token late), ``llama3-template`` (rendered in Llama 3 style). Returns (data dir, target dir, planted paths)."""
    import torch

    from . import tinymodels

    counts = {k: 3 for k in AUDIT_PLANTS} if plant is None else dict(plant)
    out = Path(out)
    model = sharpen(tinymodels.build_model("llama", num_layers=4, hidden=64, vocab=VOCAB, seed=seed), 40.0)
    target = write_target(out / "target", model, "chatml")
    tok = load(target)
    other = sharpen(tinymodels.build_model("llama", num_layers=4, hidden=64, vocab=VOCAB, seed=seed + 1), 40.0)
    text = tok.encode(english_text(200_000))
    gen = torch.Generator().manual_seed(seed + 5)
    starts = torch.randint(0, len(text) - passage - answer, (records,), generator=gen).tolist()
    head, tail = tok.encode("<|im_start|>user\n"), tok.encode("<|im_end|>\n<|im_start|>assistant\n")
    think = tok.encode("<think>\n\n</think>\n\n")
    l3_head = tok.encode("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n")
    l3_tail = tok.encode("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    kinds: dict[int, str] = {}
    order = torch.randperm(records, generator=gen).tolist()
    for name in AUDIT_PLANTS:
        for _ in range(counts.get(name, 0)):
            kinds[order.pop()] = name
    prompts = [head + text[s:s + passage] + tail + think for s in starts]
    mine = generate(model, prompts, answer)
    theirs = generate(other, [prompts[i] for i, k in kinds.items() if k == "other-model"], answer, temperature=0.7)
    theirs_it = iter(theirs)
    eot, l3_eot = tok.token_id("<|im_end|>"), tok.token_id("<|eot_id|>")
    rows = out / "data" / "rows_0-2000"
    rows.mkdir(parents=True, exist_ok=True)
    planted: dict[str, str] = {}
    for i, s in enumerate(starts):
        kind = kinds.get(i)
        p, a = prompts[i], mine[i]
        if kind == "human":
            a = text[s + passage:s + passage + answer]
        elif kind == "other-model":
            a = next(theirs_it)
        if kind == "llama3-template":
            p = l3_head + text[s:s + passage] + l3_tail
            ids = p + a + [l3_eot]
            mask = [0] * len(p) + [1] * (len(a) + 1)
        else:  # SpecForge: the answer from right after the header, empty think block and end of turn included
            ids = p + a + [eot] + tok.encode("\n")
            header_end = len(p) - len(think)
            mask = [0] * header_end + [1] * (len(ids) - header_end - 1) + [0]
        if kind == "shifted-mask":
            mask = [0] + mask[:-1]
        rel = f"data/rows_0-2000/data_{i}.ckpt"
        torch.save(specforge_record(model, ids, mask), out / rel)
        if kind:
            planted[f"rows_0-2000/data_{i}.ckpt"] = kind
    return out / "data", target, planted
