"""Which vLLM releases serve a P-EAGLE (parallel-drafting EAGLE-3) drafter, as sourced rows.

Read in the unpacked wheels: 0.14.1 has no P-EAGLE at all (no ``peagle`` speculators algorithm, no ``Peagle*``
class in the model registry); 0.25.0, 0.29.0 and 0.33.0 register the ``peagle`` speculators algorithm
(``transformers_utils/configs/speculators/algos.py``, which maps it to ``Peagle{Llama,Qwen3}ForCausalLM``) and
turn it into EAGLE-3 with parallel drafting (``speculators/base.py``); 0.34.0 refuses it: both files raise
"not supported", the ``Peagle*`` architectures left the registry, and ``llama_eagle3.py`` / ``qwen3_eagle3.py``
skip a checkpoint's ``mask_hidden`` with a warning (the drafter then drafts one token at a time). A release
inside a row's range takes that row; 0.15 - 0.24 (between the rows) were not read and have none.
"""
from __future__ import annotations

from dataclasses import dataclass

from .rules import parse_version, row_at


@dataclass(frozen=True)
class PeagleRow:
    """What vLLM ``since`` .. ``until`` does with a P-EAGLE drafter: 'absent', 'served' or 'refused'."""

    since: str
    until: str | None
    status: str
    source: str


_ALGOS = "vllm/transformers_utils/configs/speculators/algos.py"
PEAGLE_RULES: tuple[PeagleRow, ...] = (
    PeagleRow("0.14.1", "0.14.1", "absent", f"vllm 0.14.1 {_ALGOS} (no peagle algorithm); "
              "vllm/model_executor/models/registry.py (no Peagle* class)"),
    PeagleRow("0.25.0", "0.33.0", "served", f"vllm 0.25.0, 0.29.0, 0.33.0 {_ALGOS} update_peagle; "
              "vllm/transformers_utils/configs/speculators/base.py (peagle becomes eagle3 with parallel drafting)"),
    PeagleRow("0.34.0", None, "refused", f"vllm 0.34.0 {_ALGOS} update_peagle and "
              "vllm/transformers_utils/configs/speculators/base.py raise 'not supported'; no Peagle* class in "
              "vllm/model_executor/models/registry.py; llama_eagle3.py skips mask_hidden with a warning"),
)


def peagle_on_vllm(version: str) -> PeagleRow | None:
    """The row for vLLM ``version``; None where no row read covers it (a release not read)."""
    return row_at(PEAGLE_RULES, str(parse_version(version)))
