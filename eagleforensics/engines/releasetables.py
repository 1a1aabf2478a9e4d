"""Every serving and target rule's rows, as one list: the releases each row holds for and the wheel files it cites.

docs/serving-causes.md and docs/target-checks.md print these spans per rule, and
tests/test_rules_coverage.py checks that every row cites its range's releases and a file, and that the
files cited exist in the unpacked wheels of those releases.
"""
from __future__ import annotations

from dataclasses import dataclass

from .benchgenerators import GENERATORS
from .embedrules import D2T_RULES
from .failurelines import ENGINE_LINES
from .lmheadrules import LM_HEAD_RULES
from .modelclasses import releases
from .peaglerules import PEAGLE_RULES
from .rules import release_span
from .servingrules import SERVING_RULES
from .targetrules import QUANT_RULES, ROTATION_RULES


@dataclass(frozen=True)
class ReleaseRow:
    """One row of a rules table: the rule (finding code or topic), the engine, its range and what it cites."""

    rule: str
    engine: str
    since: str
    until: str | None
    source: str

    def span(self) -> str:
        return release_span(self.since, self.until)


def release_rows() -> list[ReleaseRow]:
    """The rows of every serving / target rules table (not the launch tables, which ``launchrules`` tests itself)."""
    rows = [ReleaseRow("target-quantized", r.engine, r.since, r.until, r.source) for r in QUANT_RULES]
    rows += [ReleaseRow("target-rotated", r.engine, r.since, r.until, r.source) for r in ROTATION_RULES]
    names = {"penalty": "sampling-penalty", "generation-config": "sampling-penalty (generation_config.json)",
             "lora": "lora-target", "dp-attention": "dp-attention", "verify": "plan's verify suspect"}
    rows += [ReleaseRow(names[r.topic], r.engine, r.since, r.until, r.source) for r in SERVING_RULES]
    rows += [ReleaseRow("drafter-weights-missing (lm_head)", r.engine, r.since, r.until, r.source)
             for r in LM_HEAD_RULES]
    rows += [ReleaseRow("vocab-map (d2t)", r.engine, r.since, r.until, r.source) for r in D2T_RULES]
    rows += [ReleaseRow("block-drafter-settings (P-EAGLE)", "vllm", r.since, r.until, r.source) for r in PEAGLE_RULES]
    for g in GENERATORS:
        read = [v.strip() for v in g.releases.split(",")]
        rows.append(ReleaseRow("benchmark-prompts", g.engine, read[0], read[-1], g.source))
    for engine in ("vllm", "sglang"):
        read = releases(engine)
        if read:
            where = ("vllm/model_executor/models/registry.py and the registered classes' bases" if engine == "vllm"
                     else "sglang/srt/models/registry.py (each model file's EntryClass) and the classes' bases")
            rows.append(ReleaseRow("hybrid-target, multimodal-target (EAGLE-3 support)", engine, read[0], read[-1],
                                   f"{engine} " + ", ".join(read) + f" {where}, read by the make_model_classes "
                                   "script into engines.modelclasses_data"))
    return rows


def failure_sources() -> list[str]:
    """The citations of the engine failure lines the launch check reads (``engine-refused``)."""
    return [src for _, _, src in ENGINE_LINES]


def markdown(rules: tuple[str, ...] | None = None) -> str:
    """The rows as a markdown table (``rules``: only these rules)."""
    out = ["| rule | engine | releases | read in |", "|---|---|---|---|"]
    for r in release_rows():
        if rules is None or r.rule in rules:
            out.append(f"| {r.rule} | {r.engine} | {r.span()} | {r.source.replace('|', '/')} |")
    return "\n".join(out)
