"""How each engine release turns an EAGLE-3 drafter's draft ids into target ids (the ``d2t`` map), per release read.

One row per engine: every release read gives the same answer, so a row spans them (``since`` .. ``until``: the
first and last release read; the releases between them that were read are listed in ``source``). A release past
the last row is "not read for this release": the vocab-map check then names the rows read instead of answering.

* SGLang: ``d2t`` is loaded as offsets (``hot_token_id = d2t + arange``), ``t2d`` is skipped, and with no ``d2t``
  ``hot_token_id`` stays None, so a draft id is used as the target id; an EAGLE-3 drafter ignores
  ``--speculative-token-map`` (the worker says so and keeps the map the drafter holds).
* vLLM: ``d2t`` is loaded into ``draft_id_to_target_id`` (``compute_logits`` places draft id i at
  ``i + d2t[i]``), ``t2d`` is skipped, and that buffer starts at zeros, so with no ``d2t`` draft id i is target id i.
"""
from __future__ import annotations

from dataclasses import dataclass

from .modelclasses import newest
from .rules import ENGINE_NAMES, parse_version, release_span, row_at


@dataclass(frozen=True)
class VocabMapRule:
    engine: str
    read: tuple[str, ...]  # every release read, oldest first: the row spans the first to the last
    detail: str
    source: str

    @property
    def since(self) -> str:
        return self.read[0]

    @property
    def until(self) -> str:
        return self.read[-1]

    def span(self) -> str:
        return release_span(self.since, self.until)


VOCAB_MAP_RULES: tuple[VocabMapRule, ...] = (
    VocabMapRule(
        "sglang", ("0.4.10", "0.5.4", "0.5.8", "0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.14", "0.5.17", "0.5.18",
                   "0.5.19", "0.5.20", "0.5.23"),
        "d2t is read as offsets (hot_token_id = d2t + arange), t2d is skipped, with no d2t a draft id is used as the "
        "target id, and --speculative-token-map is ignored for EAGLE-3",
        "sglang 0.4.10, 0.5.4, 0.5.8, 0.5.9, 0.5.10, 0.5.11, 0.5.12, 0.5.14, 0.5.17, 0.5.18, 0.5.19, 0.5.20, 0.5.23 "
        "srt/models/llama_eagle3.py load_weights; sglang 0.4.10, 0.5.4, 0.5.8, 0.5.12 srt/speculative/eagle_worker.py "
        "EAGLEWorker.__init__; sglang 0.5.4, 0.5.14, 0.5.23 srt/speculative/eagle_worker_v2.py init_token_map, draft "
        "(hot_token_id[topk_index] only when a map is held)"),
    VocabMapRule(
        "vllm", ("0.9.2", "0.10.0", "0.10.1.1", "0.11.0", "0.11.1", "0.12.0", "0.14.0", "0.14.1", "0.25.0", "0.29.0",
                 "0.33.0", "0.34.0"),
        "d2t is read into draft_id_to_target_id (compute_logits places draft id i at i + d2t[i]), t2d is skipped, "
        "and that buffer starts at zeros, so with no d2t draft id i is target id i",
        "vllm 0.9.2, 0.10.0, 0.10.1.1, 0.11.0, 0.11.1, 0.12.0, 0.14.0, 0.14.1, 0.25.0, 0.29.0, 0.33.0, 0.34.0 "
        "vllm/model_executor/models/llama_eagle3.py __init__, compute_logits, load_weights"),
)


@dataclass(frozen=True)
class VocabMapReading:
    """What the vocab-map check may say of the engines: the rows that answer, and the release asked but not read."""

    rows: tuple[VocabMapRule, ...]
    release: str = ""  # the release the one row answers for
    assumed: bool = False  # that release is the newest read, assumed because none was given
    between: bool = False  # that release was not read, but releases read on both sides of it agree
    unread: str = ""  # "vLLM 0.35.0": a release past the rows, or an engine with none; empty when answered

    def who(self, pin: str = "pass --engine-version or --log") -> str:
        """``SGLang 0.5.23``, or ``SGLang (0.4.10 - 0.5.23 read) and vLLM (0.9.2 - 0.34.0 read)``, for a message
        (``pin``: how to name the release, said when the newest read is assumed)."""
        if self.release:
            r = self.rows[0]
            note = (f" (the newest release read, assumed: {pin})" if self.assumed else
                    f" (not read; the releases read on both sides of it, {r.span()}, agree)" if self.between else "")
            return f"{ENGINE_NAMES[r.engine]} {self.release}{note}"
        return " and ".join(f"{ENGINE_NAMES[r.engine]} ({r.span()} read)" for r in self.rows)

    def source(self) -> str:
        return "; ".join(r.source for r in self.rows)


def vocab_map_reading(engine: str | None, version: str | None) -> VocabMapReading:
    """The row for ``engine`` at ``version`` (the newest read when none is given); with no engine, every engine's row.
    A release outside the rows, or an engine with none (TensorRT-LLM), is named in ``unread``, and the engine's row
    (every row for an engine with none) is given as what was read, not as its answer."""
    if engine is None:
        return VocabMapReading(VOCAB_MAP_RULES)
    rows = [r for r in VOCAB_MAP_RULES if r.engine == engine]
    release = version or newest(engine) or ""
    row = row_at(rows, release, until=True) if rows and release else None
    if row is None:  # the engine's own row, as what was read (both rows for an engine with none)
        name = ENGINE_NAMES.get(engine, engine) + (f" {release}" if release else "")
        return VocabMapReading(tuple(rows) or VOCAB_MAP_RULES, unread=name)
    read = {parse_version(v) for v in row.read}
    return VocabMapReading((row,), release=release, assumed=not version,
                           between=parse_version(release) not in read)
