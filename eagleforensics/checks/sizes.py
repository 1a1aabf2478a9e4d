"""Sizes and dtypes: a drafter whose widths or vocabulary disagree with the target's cannot be served as trained.

``size-mismatch`` (error): the width the drafter's fc expects per aux state, its vocabulary, or the
shapes of its fc / lm_head / embedding disagree with the target's config or with its own config.
Engines crash at load or at CUDA-graph capture, or (when the product of sizes happens to agree)
feed the wrong widths (sgl-project/sglang#8163, vllm-project/vllm#17740, deepseek-ai/DeepSpec#44).
``dtype-mismatch``: a float16 drafter beside a bfloat16 target overflows where the target does not
(warning; sgl-project/sglang#27883, #25894); other float differences are cast by the engine (info).
"""
from __future__ import annotations

from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .drafterfacts import FLOAT_DTYPES, Listed, draft_facts, drafter_tensor, target_facts
from .registry import register

SIZE_SOURCE = "sgl-project/sglang#8163, vllm-project/vllm#17740, deepseek-ai/DeepSpec#44"
DTYPE_SOURCE = "sgl-project/sglang#27883, sgl-project/sglang#25894"


def _weight_dtype(art: Artifacts) -> str | None:
    """The float dtype most of the drafter's weights are stored in (None when it has no float tensor)."""
    counts: dict[str, int] = {}
    for info in art.drafter.tensors.values():
        if info.dtype in FLOAT_DTYPES:
            counts[FLOAT_DTYPES[info.dtype]] = counts.get(FLOAT_DTYPES[info.dtype], 0) + info.numel
    return max(counts, key=counts.__getitem__) if counts else None


def _size_findings(art: Artifacts) -> list[str]:
    d = draft_facts(art.drafter.config)
    t = target_facts(art.target.config)
    names = Listed(art.drafter)
    out: list[str] = []
    if d.target_hidden_size and t.hidden_size and d.target_hidden_size != t.hidden_size:
        out.append(f"the drafter expects aux states {d.target_hidden_size} wide (config "
                   f"{'target_hidden_size' if d.raw.get('target_hidden_size') else 'hidden_size'}), the target's "
                   f"hidden_size is {t.hidden_size}")
    if d.vocab_size and t.vocab_size and d.vocab_size != t.vocab_size:
        out.append(f"the drafter's vocab_size is {d.vocab_size}, the target's {t.vocab_size}: another tokenizer "
                   "or family")
    fc = drafter_tensor(names, "fc.weight")
    if fc is not None and len(names[fc].shape) == 2:
        rows, cols = names[fc].shape
        width = t.hidden_size or d.target_hidden_size
        if width and cols != d.num_aux * width:
            out.append(f"{fc} reads {cols} features; {d.num_aux} aux states of the target's width {width} "
                       f"give {d.num_aux * width}")
        if d.hidden_size and rows != d.hidden_size:
            out.append(f"{fc} writes {rows} features, the drafter's hidden_size is {d.hidden_size}")
    head = drafter_tensor(names, "lm_head.weight")
    if head is not None and d.draft_vocab_size and d.hidden_size \
            and names[head].shape != (d.draft_vocab_size, d.hidden_size):
        out.append(f"{head} has shape {list(names[head].shape)}, the config implies "
                   f"[{d.draft_vocab_size}, {d.hidden_size}] (draft_vocab_size, hidden_size)")
    embed = drafter_tensor(names, "embed_tokens.weight")
    if embed is not None and d.vocab_size and d.hidden_size and names[embed].shape != (d.vocab_size, d.hidden_size):
        out.append(f"{embed} has shape {list(names[embed].shape)}, the config implies "
                   f"[{d.vocab_size}, {d.hidden_size}] (vocab_size, hidden_size)")
    return out


def run(art: Artifacts) -> CheckResult:
    """Compare the drafter's config and tensor shapes with the target's config; then the two dtypes."""
    findings: list[Finding] = []
    problems = _size_findings(art)
    if problems:
        findings.append(Finding(
            "size-mismatch", "error", "the drafter's sizes disagree with the target's: " + "; ".join(problems) + ".",
            fix="Use a drafter trained for this target (same tokenizer and hidden size), or fix the exported "
                "config so it matches its weights.", source=SIZE_SOURCE, impact="collapse"))
    t_dtype = target_facts(art.target.config).dtype
    d_dtype = _weight_dtype(art)
    data = {"drafter_dtype": d_dtype, "target_dtype": t_dtype}
    if t_dtype and d_dtype and t_dtype != d_dtype:
        risky = {t_dtype, d_dtype} == {"bfloat16", "float16"}
        findings.append(Finding(
            "dtype-mismatch", "warning" if risky else "info",
            f"the drafter's weights are {d_dtype}, the target is {t_dtype}"
            + (": float16 has a far smaller range than bfloat16, so the drafter's activations can overflow to "
               "Inf/NaN where the target's do not." if risky else "; the engine casts the drafter to the served "
               "dtype, which costs at most rounding."),
            fix="Serve (and export) the drafter in the target's dtype." if risky else "",
            source=DTYPE_SOURCE, impact="medium" if risky else "low"))
    note = "widths, vocabulary and fc/lm_head/embedding shapes agree with the target" if not problems else ""
    return CheckResult(tuple(findings), note, data)


CHECK = register(Check("sizes", "sizes and dtype against the target", ("size-mismatch", "dtype-mismatch"),
                       ("drafter", "target"), run, order=10))
