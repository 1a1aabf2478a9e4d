"""The engines' serving-benchmark generators of synthetic prompts, as the released wheels write them.

Both draw CONSECUTIVE token ids from a random offset, not uniform draws (read, not copied):

* vLLM ``RandomDataset`` (``vllm bench serve --dataset-name random``): the ids
  ``allowed[(offset + index + arange(input_len)) % len(allowed)]`` (special ids left out of ``allowed``),
  decoded to text, re-encoded and truncated to the wanted length (``gen_prompt_decode_to_target_len``); an
  optional prefix of uniform draws. Read in 0.11.0 and 0.14.0 ``vllm/benchmarks/datasets.py``, 0.25.0,
  0.33.0 and 0.34.0 ``vllm/benchmarks/datasets/datasets.py``.
* SGLang ``random-ids`` (``python -m sglang.bench_serving --dataset-name random-ids``; ``random`` takes
  ShareGPT text instead): ``(offsets[i] + i + j) % vocab_size``, sent as ids or decoded (``return_text``). Read
  in 0.5.8 ``sglang/bench_serving.py`` (``sample_random_requests``) and 0.5.10, 0.5.23
  ``sglang/benchmark/datasets/random.py``.

Decoding and re-encoding keeps most neighbours consecutive: with SmolLM2's 49k-id tokenizer 78 - 87 % of
the steps of five such 128-id prompts stay +1 or +2, against under 1 % in English text.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Generator:
    engine: str
    name: str
    releases: str
    source: str


GENERATORS: tuple[Generator, ...] = (
    Generator("vllm", "RandomDataset (--dataset-name random)", "0.11.0, 0.14.0, 0.25.0, 0.33.0, 0.34.0",
              "vllm 0.11.0, 0.14.0 vllm/benchmarks/datasets.py; 0.25.0, 0.33.0, 0.34.0 "
              "vllm/benchmarks/datasets/datasets.py RandomDataset.generate_token_sequence"),
    Generator("sglang", "random-ids (--dataset-name random-ids)", "0.5.8, 0.5.10, 0.5.23",
              "sglang 0.5.8 sglang/bench_serving.py sample_random_requests; 0.5.10, 0.5.23 "
              "sglang/benchmark/datasets/random.py"),
)
CONSECUTIVE_SHARE = 0.15  # steps of +1 or +2 (a special id skipped) among a prompt's neighbours; text: under 0.01
MAX_STEP = 2


def consecutive_share(ids: list[int]) -> float:
    """The share of neighbouring ids that step up by 1 or 2 (0 for fewer than two ids)."""
    if len(ids) < 2:
        return 0.0
    hits = sum(1 for a, b in zip(ids, ids[1:]) if 1 <= b - a <= MAX_STEP)
    return hits / (len(ids) - 1)


def cite() -> str:
    """Every generator's name and source, for a finding."""
    return "; ".join(f"{g.engine} {g.name}: {g.source}" for g in GENERATORS)
