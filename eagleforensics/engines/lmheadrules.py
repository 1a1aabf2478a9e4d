"""What each engine release serves as an EAGLE-3 drafter's lm_head when the drafter's checkpoint has none.

Rows read from the released wheels (``since`` .. ``until``: the releases read where the row holds; a
release past the last row is "not read for this release"; one between two rows read takes the earlier,
as in ``servingrules``):

* ``never``: the drafter's own head is built and loaded from its checkpoint; a missing one stays at its
  allocation (a random or uninitialised head, sgl-project/sglang#27908).
* ``same-shape``: the target's head is used when the drafter's head has the target's shape (a full draft
  vocabulary), else the drafter's own.
* ``when-missing``: the target's head is used when the checkpoint has no ``lm_head`` (vllm-project/vllm#28549).
* ``no-draft-vocab``: the target's head is used when the draft config has no ``draft_vocab_size``; with one,
  the drafter's own head is loaded (missing: random).
"""
from __future__ import annotations

from dataclasses import dataclass

from .modelclasses import newest
from .rules import release_span, row_at


@dataclass(frozen=True)
class LmHeadRule:
    engine: str
    since: str
    until: str | None
    outcome: str  # never | same-shape | when-missing | no-draft-vocab
    detail: str
    source: str

    def span(self) -> str:
        return release_span(self.since, self.until)


LM_HEAD_RULES: tuple[LmHeadRule, ...] = (
    LmHeadRule("vllm", "0.9.2", "0.10.1.1", "never", "for EAGLE-3 the target's head is shared only for other methods, "
               "so the drafter's own head is loaded from its checkpoint",
               "vllm 0.9.2, 0.10.0, 0.10.1.1 vllm/v1/spec_decode/eagle.py load_model (method != 'eagle3')"),
    LmHeadRule("vllm", "0.11.0", "0.11.0", "same-shape", "the target's head replaces the drafter's when both have "
               "the same shape (a full draft vocabulary); otherwise the drafter's own head is loaded",
               "vllm 0.11.0 vllm/v1/spec_decode/eagle.py load_model (\"Assuming the EAGLE head shares the same "
               "lm_head\")"),
    LmHeadRule("vllm", "0.11.1", "0.34.0", "when-missing", "a checkpoint without lm_head marks the drafter "
               "has_own_lm_head False and the target's head is shared",
               "vllm 0.11.1, 0.12.0, 0.14.0 vllm/v1/spec_decode/eagle.py load_model and "
               "vllm/model_executor/models/utils.py process_eagle_weight; 0.25.0, 0.33.0 "
               "v1/spec_decode/llm_base_proposer.py; 0.34.0 v1/worker/gpu/spec_decode/eagle/utils.py _should_share "
               "(vllm-project/vllm#28549)"),
    LmHeadRule("sglang", "0.4.10", "0.4.10", "never", "EAGLE-3 drafters never share the target's head: the "
               "drafter's own is loaded from its checkpoint",
               "sglang 0.4.10 srt/speculative/eagle_worker.py (\"EAGLE3 models don't share lm_head\"), "
               "srt/models/llama_eagle3.py"),
    LmHeadRule("sglang", "0.5.4", "0.5.23", "no-draft-vocab", "the target's head is shared when the draft config "
               "has no draft_vocab_size (load_lm_head_from_target); with one, the drafter's own head is loaded",
               "sglang 0.5.4, 0.5.8 - 0.5.12, 0.5.20, 0.5.23 srt/models/llama_eagle3.py load_lm_head_from_target; "
               "srt/speculative/eagle_worker.py / eagle_worker_v2.py set_embed_and_head (sgl-project/sglang#27908 "
               "for the random head)"),
)


def lm_head_rule(engine: str | None, version: str | None) -> tuple[LmHeadRule | None, str]:
    """The row for ``engine`` at ``version`` and the release assumed (the newest read when none is given); None when
    the engine is unknown or the release is past the rows read."""
    if engine not in ("vllm", "sglang"):
        return None, ""
    release = version or newest(engine) or ""
    rows = [r for r in LM_HEAD_RULES if r.engine == engine]
    row = row_at(rows, release, until=True)
    return row, release


def shares_target_head(rule: LmHeadRule, draft_vocab: int | None, target_vocab: int | None) -> bool | None:
    """Whether a drafter without lm_head gets the target's head under ``rule`` (None: not known from the configs)."""
    if rule.outcome == "never":
        return False
    if rule.outcome == "when-missing":
        return True
    if rule.outcome == "no-draft-vocab":
        return draft_vocab is None
    if draft_vocab is None or target_vocab is None:
        return None if draft_vocab is not None else True
    return draft_vocab == target_vocab
