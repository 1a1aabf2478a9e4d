"""Benchmark prompts unlike real traffic: random token ids, or generation forced past EOS (docs/causes.md row 30).

``benchmark-prompts``: the served requests (``--served-prompts``) are random token ids (vLLM's
``RandomDataset`` and SGLang's ``random-ids`` draw consecutive ids from a random offset and send them as ids
or decoded text, ``engines.benchgenerators``; other generators draw uniformly), or set ``ignore_eos`` (the
benchmarks' ``--ignore-eos``: the target keeps generating past its own end, into text no drafter was trained
on). Acceptance measured on either is far below real traffic's (vllm-project/vllm#52536,
ai-dynamo/dynamo#12918, ggml-org/llama.cpp#27711, vllm-project/vllm#33497), so a low figure there says little
about the drafter.

A prompt is read as random ids when it has at least ``MIN_TOKENS`` ids, nearly as many distinct ids as uniform
draws from the vocabulary would give (at least ``DISTINCT_SHARE`` of that expectation; text repeats its
frequent tokens far more), and its ids spread over the vocabulary like uniform draws (the share in the upper
half within ``UPPER_HALF``; text concentrates on the frequent, mostly low ids of a BPE vocabulary). Text
prompts are tokenized with the target's tokenizer (``--target`` with ``tokenizer.json``), chat requests by
their messages' text (a benchmark wraps random text in a user message), else only id prompts are read. Cause
(for the grouping of findings): the measurement, not the drafter.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..engines.benchgenerators import CONSECUTIVE_SHARE, cite, consecutive_share
from ..errors import printable
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register

SOURCE = ("vllm-project/vllm#52536, ai-dynamo/dynamo#12918, ggml-org/llama.cpp#27711, vllm-project/vllm#33497 "
          "(docs/causes.md row 30)")
CAUSE = "benchmark workload unlike real traffic"
MIN_TOKENS = 32
DISTINCT_SHARE = 0.9
UPPER_HALF = (0.3, 0.7)
WARN_SHARE = 0.2  # a warning when at least this share of the prompts is random or ignores EOS


def expected_distinct(n: int, vocab: int) -> float:
    """The expected number of distinct ids among ``n`` uniform draws from ``vocab`` ids."""
    return vocab * (1.0 - (1.0 - 1.0 / vocab) ** n)


def looks_generated(ids: Sequence[int]) -> bool:
    """Whether ``ids`` are the engines' benchmark generators' consecutive ids from an offset
    (``engines.benchgenerators``): most neighbours step up by one, also after decoding and re-encoding."""
    return len(ids) >= MIN_TOKENS and consecutive_share(list(ids)) >= CONSECUTIVE_SHARE


def looks_random(ids: Sequence[int], vocab: int | None) -> bool:
    """Whether ``ids`` look like uniform draws from the vocabulary (``vocab``; None: the largest id + 1)."""
    n = len(ids)
    if n < MIN_TOKENS:
        return False
    v = max(int(vocab) if vocab else 0, max(ids) + 1)
    if v < 2 * n:  # too small a vocabulary to tell draws from text by repeats
        return False
    if len(set(ids)) < DISTINCT_SHARE * expected_distinct(n, v):
        return False
    upper = sum(1 for i in ids if i >= v / 2) / n
    return UPPER_HALF[0] <= upper <= UPPER_HALF[1]


def _vocab(art: Artifacts) -> int | None:
    if not art.available("target"):
        return None
    value = art.target.config.get("vocab_size") or (art.target.config.get("text_config") or {}).get("vocab_size")
    return int(value) if isinstance(value, int) and value > 0 else None


def _tokenizer(art: Artifacts) -> tuple[Any, str]:
    if not art.available("target"):
        return None, "text prompts not tested for random ids (pass --target with its tokenizer files)"
    from ..errors import ForensicsError
    from ..io.tokenizer import has_tokenizer, load_tokenizer

    if not has_tokenizer(art.inputs.target):
        return None, "text prompts not tested for random ids (the target has no tokenizer.json)"
    try:
        return load_tokenizer(art.inputs.target), ""
    except ForensicsError as exc:
        return None, f"text prompts not tested for random ids ({exc})"


def run(art: Artifacts) -> CheckResult:
    """Count the prompts that are random ids and the requests that ignore EOS."""
    prompts = art.served_prompts
    vocab = _vocab(art)
    tok, tok_note = (None, "") if all(p.kind == "ids" for p in prompts) else _tokenizer(art)
    tok_note = tok_note.replace("text prompts", "text and chat prompts")
    random_lines, tested, ignore = [], 0, []
    generated_lines: list[int] = []
    lengths: list[int] = []
    for p in prompts:
        if p.sampling.get("ignore_eos") is True:
            ignore.append(p.line)
        if p.kind == "ids":
            ids = p.ids or []
        elif tok is not None and p.kind == "text":
            ids = tok.encode(p.text or "")
        elif tok is not None:  # chat: the messages' text (benchmarks wrap random text in a user message)
            ids = tok.encode("\n".join(m["content"] for m in p.messages or [] if isinstance(m.get("content"), str)))
        else:
            continue
        tested += 1
        if looks_generated(ids):
            generated_lines.append(p.line)
            random_lines.append(p.line)
            lengths.append(len(ids))
        elif looks_random(ids, vocab):
            random_lines.append(p.line)
    total = len(prompts)
    data: dict[str, Any] = {"prompts": total, "tested_for_random_ids": tested, "random_ids": len(random_lines),
                            "random_lines": random_lines[:20], "ignore_eos": len(ignore),
                            "ignore_eos_lines": ignore[:20],
                            "vocab": vocab, "cause": CAUSE, "generator_ids": len(generated_lines),
                            "generator_lengths": sorted(set(lengths))[:10]}
    findings = []
    parts = []
    if random_lines:
        how = []
        if generated_lines:
            same = f", all {lengths[0]} tokens long" if len(set(lengths)) == 1 and len(lengths) > 1 else ""
            how.append(f"{len(generated_lines)} are consecutive ids from an offset{same}, as the engines' benchmark "
                       "generators write them (vLLM's RandomDataset, SGLang's random-ids)")
        if len(random_lines) > len(generated_lines):
            how.append(f"{len(random_lines) - len(generated_lines)} have nearly all ids distinct and spread evenly "
                       "over the vocabulary, as uniform draws are")
        parts.append(f"{len(random_lines)} of {total} prompts are random token ids (lines "
                     f"{', '.join(map(str, random_lines[:5]))}{', ...' if len(random_lines) > 5 else ''}: "
                     + "; ".join(how) + ")")
    if ignore:
        parts.append(f"{len(ignore)} of {total} requests set ignore_eos (the target keeps generating past its "
                     "own end, into text no drafter was trained on)")
    if parts:
        share = max(len(random_lines), len(ignore)) / total
        severity = "warning" if share >= WARN_SHARE else "info"
        msg = ("The served prompts look like a synthetic benchmark: " + "; ".join(parts) + ". Acceptance measured "
               "on such a workload is far below real traffic's, so it says little about the drafter.")
        source = f"{SOURCE}; {cite()}" if generated_lines else SOURCE
        findings.append(Finding("benchmark-prompts", severity, printable(msg),
                                 fix="Measure acceptance on real prompts (a sample of production traffic, or a "
                                     "chat dataset sent through the chat template) without ignore_eos.",
                                 source=source, impact="medium" if severity == "warning" else "low"))
    note = f"{tested} of {total} prompts tested for random ids, {len(random_lines)} random; " \
           f"{len(ignore)} with ignore_eos" + (f"; {tok_note}" if tok_note else "")
    return CheckResult(tuple(findings), note, data)


CHECK = register(Check("benchmark-prompts", "random-id or ignore_eos benchmark prompts (--served-prompts)",
                       ("benchmark-prompts",), ("served_prompts",), run, order=63))
