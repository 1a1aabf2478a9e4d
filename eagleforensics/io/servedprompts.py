"""Served prompts as a JSONL file: what the server was sent, one request per line (``doctor --served-prompts``).

Each line is a JSON object in one of three forms (the request bodies of OpenAI-compatible servers,
or what a benchmark logs):

* ``{"messages": [...], "chat_template_kwargs": {"enable_thinking": false}}``: a chat request; the
  server renders it with the target's chat template (its default) and these kwargs;
* ``{"prompt": "..."}`` (or ``"text"``): a completion request, sent as written (a benchmark without
  ``--use-chat-template`` sends raw text here);
* ``{"prompt_token_ids": [...]}`` (or ``"input_ids"``, ``"token_ids"``, or ``"prompt"`` as a list of ints).

A request wrapped as ``{"body": {...}}`` (OpenAI batch files) is unwrapped. Sampling parameters the
request carries (``SAMPLING_KEYS``: temperature, the repetition / frequency / presence penalties,
``ignore_eos``, ...) are kept in ``sampling``, read at the top level (OpenAI and vLLM bodies), under
``sampling_params`` (SGLang's ``/generate``) and under ``extra_body`` (the OpenAI client's pass-through);
a value of the wrong type is bad input. Bounded: the file at most
``MAX_FILE_BYTES``, a line ``MAX_LINE_BYTES``, at most ``MAX_PROMPTS`` prompts read.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ForensicsError
from .guards import open_regular, parse_json
from .sizecheck import human_bytes

MAX_FILE_BYTES = 512 * 1024 * 1024
MAX_LINE_BYTES = 8 * 1024 * 1024
MAX_PROMPTS = 2000
ID_KEYS = ("prompt_token_ids", "input_ids", "token_ids")
# sampling parameters kept per request: numbers, except ignore_eos (a flag)
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
                 "presence_penalty", "ignore_eos", "min_tokens", "max_tokens", "max_new_tokens",
                 "max_completion_tokens")
RESERVED_KWARGS = frozenset({"messages", "add_generation_prompt", "tools", "documents"})  # what render() passes


@dataclass(frozen=True)
class ServedPrompt:
    """One served request: chat ``messages`` (+ template kwargs), a ``text`` prompt, or token ``ids``."""

    line: int
    messages: list[dict[str, Any]] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    text: str | None = None
    ids: list[int] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # SAMPLING_KEYS the request set
    source: Path | None = None  # the served prompts file, named by errors found when the prompt is used
    lora_path: str | None = None  # SGLang's ``lora_path``: the LoRA adapter the request is served through
    model: str | None = None  # the OpenAI body's ``model`` (vLLM serves a LoRA adapter by its name there)

    @property
    def kind(self) -> str:
        return "chat" if self.messages is not None else "text" if self.text is not None else "ids"

    def token_ids(self, tok: Any) -> list[int]:
        """The ids the server feeds the model (``tok``: ``io.tokenizer.ChatTokenizer``); an id outside the
        tokenizer's vocabulary, or a conversation the template cannot render, is bad input naming this file."""
        if self.ids is not None:
            vocab = tok.vocab_size
            bad = next((v for v in self.ids if v >= vocab), None)
            if bad is not None:
                raise ForensicsError(f"line {self.line}: token id {bad} is outside the target tokenizer's vocabulary "
                                     f"of {vocab} ids (ids from another model?)", path=self.source)
            return list(self.ids)
        if self.text is not None:
            return tok.encode(self.text)
        try:
            text = tok.render(self.messages or [], add_generation_prompt=True, **self.kwargs)
        except ForensicsError as exc:
            where = tok.template_file or tok.path
            raise ForensicsError(f"line {self.line}: the chat template ({where.name}) cannot render this request: "
                                 f"{exc.detail.removeprefix('chat template failed on a probe conversation: ')}",
                                 path=self.source) from None
        return tok.encode(text)


def _sampling(obj: dict[str, Any], n: int, path: Path) -> dict[str, Any]:
    """The request's sampling parameters: top level, then ``sampling_params`` and ``extra_body`` (later wins)."""
    out: dict[str, Any] = {}
    for where in (obj, obj.get("sampling_params"), obj.get("extra_body")):
        if not isinstance(where, dict):
            continue
        for key in SAMPLING_KEYS:
            value = where.get(key)
            if value is None:
                continue
            if key == "ignore_eos":
                if not isinstance(value, bool):
                    raise ForensicsError(f"line {n}: 'ignore_eos' must be true or false", path=path)
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise ForensicsError(f"line {n}: {key!r} must be a number", path=path)
            out[key] = value
    return out


def _named(obj: dict[str, Any]) -> dict[str, str]:
    """SGLang's ``lora_path`` (a name or path, or a list with one per prompt) and the body's ``model``, when strings."""
    out = {}
    lora = obj.get("lora_path")
    if isinstance(lora, list):
        lora = next((v for v in lora if isinstance(v, str) and v), None)
    if isinstance(lora, str) and lora:
        out["lora_path"] = lora
    model = obj.get("model")
    if isinstance(model, str) and model:
        out["model"] = model
    return out


def _parse(obj: Any, n: int, path: Path) -> ServedPrompt:
    prompt = _parse_body(obj, n, path)
    body = obj["body"] if isinstance(obj, dict) and isinstance(obj.get("body"), dict) else obj
    named = _named(body)
    return replace(prompt, **named) if named else prompt


def _parse_body(obj: Any, n: int, path: Path) -> ServedPrompt:
    if isinstance(obj, dict) and isinstance(obj.get("body"), dict):
        obj = obj["body"]
    if not isinstance(obj, dict):
        raise ForensicsError(f"line {n} is not a JSON object", path=path)
    sampling = _sampling(obj, n, path)
    msgs = obj.get("messages")
    if msgs is not None:
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
            raise ForensicsError(f"line {n}: 'messages' must be a list of objects with a 'role'", path=path)
        kw = obj.get("chat_template_kwargs") or {}
        if not isinstance(kw, dict):
            raise ForensicsError(f"line {n}: 'chat_template_kwargs' must be an object", path=path)
        reserved = sorted(set(kw) & RESERVED_KWARGS)
        if reserved:
            raise ForensicsError(f"line {n}: 'chat_template_kwargs' sets {', '.join(map(repr, reserved))}, which the "
                                 "request itself sets (the messages and the generation prompt)", path=path)
        return ServedPrompt(n, messages=msgs, kwargs={str(k): v for k, v in kw.items()}, sampling=sampling,
                            source=path)
    for key in ("prompt", "text", *ID_KEYS):
        value = obj.get(key)
        if isinstance(value, str) and key in ("prompt", "text"):
            return ServedPrompt(n, text=value, sampling=sampling, source=path)
        if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                     for v in value):
            return ServedPrompt(n, ids=[int(v) for v in value], sampling=sampling, source=path)
        if isinstance(value, list) and value and key != "text":
            bad = next(v for v in value if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0))
            raise ForensicsError(f"line {n}: '{key}' holds {json.dumps(bad)[:40]}, not a token id (a whole number "
                                 "from 0)", path=path)
    raise ForensicsError(f"line {n} has no 'messages', 'prompt' (text or ids), 'text' or token ids "
                         f"({', '.join(ID_KEYS)})", path=path)


def load_served_prompts(path: str | Path, limit: int = MAX_PROMPTS) -> list[ServedPrompt]:
    """The first ``limit`` prompts of a JSONL file; bad input is one line naming the file and the line."""
    p = Path(path)
    out: list[ServedPrompt] = []
    with open_regular(p, "served prompts file") as fh:
        size = fh.seek(0, 2)
        fh.seek(0)
        if size > MAX_FILE_BYTES:
            raise ForensicsError(f"is larger than {human_bytes(MAX_FILE_BYTES)}; pass a sample of the served prompts",
                                 path=p)
        for n, raw in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_LINE_BYTES:
                raise ForensicsError(f"line {n} is longer than {human_bytes(MAX_LINE_BYTES)}", path=p)
            if not raw.strip():
                continue
            try:
                obj = parse_json(raw, p, f"line {n}")
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ForensicsError(f"line {n} is not JSON (one request object per line expected)", path=p) from None
            try:
                json.dumps(obj, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise ForensicsError(f"line {n} holds a lone surrogate (an escape such as \\ud800 that is not a "
                                     "character): not text a server can tokenize", path=p) from None
            out.append(_parse(obj, n, p))
            if len(out) >= limit:
                break
    if not out:
        raise ForensicsError("holds no prompts", path=p)
    return out
