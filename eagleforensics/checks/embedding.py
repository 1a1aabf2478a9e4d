"""The drafter's own embedding and head against the target's: a fresh random init or another model's weights.

``embedding-random``: the drafter carries an ``embed_tokens`` whose sampled rows have cosine ~0 with
the target's and look i.i.d. (a fresh init exported after a ``strict=False`` load: lightseekorg/TorchSpec#38,
sgl-project/sglang#27908). ``embedding-not-target``: rows unlike the target's but not a fresh init (another
model's or another revision's embedding). Both are errors only where the engine embeds with the
drafter's own matrix; where it uses the target's they are info (harmless there, a trap on a move).
``lm-head-not-target``: for drafters whose trainer copies the target's ``lm_head`` rows at the draft
ids and freezes them, a head that is not those rows (a head trained from scratch, as SpecForge's, is
not a defect and is not checked). Numerics: ``checks.rowcompare``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .draftvocab import MapDiagnosis
from .drafterfacts import Listed, draft_facts, drafter_tensor
from .engineembed import trainer_copies_head, uses_own_embedding
from .registry import register
from .rowcompare import FRESH_COS, compare_rows, init_signature, sample_rows
from .vocabmap import diagnosis

RANDOM_SOURCE = "lightseekorg/TorchSpec#38, sgl-project/sglang#27908 (docs/causes.md row 11)"
NOT_TARGET_SOURCE = "vllm-project/vllm#27732, vllm-project/vllm#28549 (docs/causes.md rows 2, 11)"
HEAD_SOURCE = ("speculators 0.9.0 speculators/model.py _load_verifier_weights (lm_head = verifier lm_head[t2d], "
               "frozen); docs/causes.md row 11")


CONVERTER_SOURCE = ("speculators 0.9.0 speculators/convert/eagle/eagle3_converter.py _save_converted_checkpoint (the "
                    "source weights loaded as they are, embed_tokens only when the source has one); "
                    "speculators/models/eagle3/core.py _keys_to_ignore_on_save (a trained drafter saves embed_tokens "
                    "and lm_head = verifier lm_head[t2d], speculators/model.py _load_verifier_weights)")


def _with(source: str, rule_source: str) -> str:
    return f"{source}; {rule_source}" if rule_source else source


def _cos(x: float, digits: int = 2) -> str:
    """A cosine for people (no "-0.00")."""
    return f"{round(x, digits) + 0.0:.{digits}f}"


def _severity(uses_own: bool | None) -> str:
    return "error" if uses_own else "warning" if uses_own is None else "info"


def _engine_clause(uses_own: bool | None, rule: str) -> str:
    if uses_own is None:
        return ("; whether this costs acceptance depends on the engine (pass --engine): engines that embed with the "
                "drafter's own matrix feed the drafter noise")
    if uses_own:
        return f"; {rule}, so every draft starts from the wrong token embedding"
    return f"; {rule}, so it is unused there (it would not be on an engine that keeps the drafter's own)"


def check_embedding(art: Artifacts) -> tuple[list[Finding], str, dict[str, Any]]:
    """Compare the drafter's ``embed_tokens`` with the target's on sampled rows."""
    names = Listed(art.drafter)
    own = drafter_tensor(names, "embed_tokens.weight")
    if own is None:
        return [], "no embed_tokens of its own: engines embed with the target's", {}
    ref = art.target.find("embed")
    if ref is None:
        return [], "the target has no embed_tokens tensor to compare with", {}
    if names[own].shape != art.target.info(ref).shape:
        return [], (f"{own} {list(names[own].shape)} is not the target's {list(art.target.info(ref).shape)} shape "
                    "(the sizes row reports it)"), {}
    idx = sample_rows(names[own].shape[0])
    mine, theirs = art.drafter.rows(own, idx), art.target.rows(ref, idx)
    cmp, sig = compare_rows(mine, theirs), init_signature(mine)
    data = {"embedding": cmp.to_dict(), "init": sig.to_dict()}
    if cmp.copy:
        return [], f"the drafter's embed_tokens is the target's (median row cosine {_cos(cmp.median_cos, 3)})", data
    uses_own, rule, rule_source = uses_own_embedding(art)
    data["engine_uses_own_embedding"] = uses_own
    clause = _engine_clause(uses_own, rule)
    if sig.fresh and abs(cmp.median_cos) < FRESH_COS:
        std = f"std {sig.std:.3g}" + (f", the {sig.known_std:g} of a default init" if sig.known_std else "")
        msg = (f"the drafter's {own} is a fresh random init, not the target's embedding: median row cosine "
               f"{_cos(cmp.median_cos)} with the target's rows over {cmp.rows} sampled rows, entries i.i.d. ({std}, "
               f"row norms near std*sqrt(H)){clause}.")
        return [Finding("embedding-random", _severity(uses_own), msg,
                        fix="Re-export the drafter with the target's embedding (copy model.embed_tokens.weight from the "
                            "target), or drop embed_tokens from the checkpoint so the engine uses the target's.",
                        source=_with(RANDOM_SOURCE, rule_source),
                        impact="collapse" if uses_own is not False else "low")], "", data
    if draft_facts(art.drafter.config).raw.get("embed_requires_grad") is True:
        # trained on purpose: a cost only where the engine swaps in the target's
        if uses_own is False:
            return [Finding("embedding-not-target", "warning",
                            f"the drafter trained its own {own} (embed_requires_grad; median row cosine "
                            f"{_cos(cmp.median_cos)} with the target's), but {rule}: it is served with an embedding "
                            "it did not learn.", fix="Serve it on an engine that keeps the drafter's own embedding "
                            "(vLLM >= 0.11.1), or retrain with the embedding frozen.",
                            source=_with(NOT_TARGET_SOURCE, rule_source), impact="medium")], "", data
        return [Finding("embedding-not-target", "info",
                        f"the drafter's {own} has drifted from the target's (median row cosine {_cos(cmp.median_cos)}); "
                        "its config says the embedding was trained (embed_requires_grad), so this is expected"
                        + (f" ({rule})" if rule else "; an engine that swaps in the target's would serve it with an "
                           "embedding it did not learn (pass --engine)") + ".",
                        source=_with(NOT_TARGET_SOURCE, rule_source), impact="low")], "", data
    kind = ("another model's embedding" if abs(cmp.median_cos) < FRESH_COS else
            "a related but different embedding (another revision or fine-tune of the target?)")
    msg = (f"the drafter's {own} is not the target's: median row cosine {_cos(cmp.median_cos)} over {cmp.rows} sampled "
           f"rows, and not a fresh init ({sig.why}): {kind}{clause}.")
    return [Finding("embedding-not-target", _severity(uses_own), msg,
                    fix="Use the drafter trained for this target, or re-export it with this target's embedding "
                        "(and retrain if the drafter learned on another model's).",
                    source=_with(NOT_TARGET_SOURCE, rule_source),
                    impact="collapse" if uses_own else "high" if uses_own is None else "low")
            ], "", data


def head_rows(dx: MapDiagnosis, n: int) -> np.ndarray | None:
    """The target ids the drafter's head rows stand for (draft id order), or None when the map is unusable."""
    if dx.kind == "full":
        return np.arange(n)
    if dx.intended is not None and dx.intended.size == n:
        return np.sort(dx.intended)
    return None


def check_head(art: Artifacts) -> tuple[list[Finding], str, dict[str, Any]]:
    """For a trainer that copies the target's head: the drafter's lm_head rows against the target's at the draft ids."""
    copies, trainer, trainer_source = trainer_copies_head(art)
    if not copies:
        return [], f"lm_head not compared: {trainer} trains its head from scratch", {}
    names = Listed(art.drafter)
    own, ref = drafter_tensor(names, "lm_head.weight"), art.target.find("lm_head")
    if own is None or ref is None:
        return [], "no lm_head to compare (the sizes row reports a missing head)", {}
    n = names[own].shape[0]
    _, dx = diagnosis(art)
    ids = head_rows(dx, n)
    if ids is None or names[own].shape[1] != art.target.info(ref).shape[1]:
        return [], "lm_head not compared: no usable draft-id map or widths differ (see vocab-map and sizes)", {}
    pick = sample_rows(n, seed=1)
    cmp = compare_rows(art.drafter.rows(own, pick), art.target.rows(ref, ids[pick]))
    data = {"lm_head": cmp.to_dict(), "trainer": trainer}
    if cmp.copy:
        return [], f"lm_head is the target's rows at the draft ids, as {trainer} writes it", data
    if drafter_tensor(names, "embed_tokens.weight") is None:
        # speculators' trainer saves its frozen embed_tokens copy; its converter keeps only what the source had
        data["converted"] = True
        msg = (f"this drafter's {own} is not the target's rows at the draft ids (median row cosine "
               f"{_cos(cmp.median_cos)} over {cmp.rows} sampled rows). It is in speculators' layout but carries no "
               "embed_tokens of its own, as speculators' converter writes it (speculators convert keeps the source "
               "checkpoint's weights, its lm_head included), not as speculators' trainer does (which copies and "
               "freezes the target's rows, and saves embed_tokens): the head is most likely the source trainer's "
               "own, the one this decoder was trained with (SpecForge trains its head), and then costs nothing. Only "
               "if the source trainer also copied the target's rows is it a defect.")
        return [Finding("lm-head-not-target", "warning", msg,
                        fix="Check which trainer wrote the source checkpoint: if it trained its own head, nothing to "
                            "do; if it copied the target's rows, re-export with lm_head = target lm_head[t2d]. "
                            "Replay on a capture (--capture) measures this drafter as it is.",
                        source=CONVERTER_SOURCE, impact="low")], "", data
    msg = (f"{trainer} copies the target's lm_head rows at the draft ids and freezes them, but this drafter's {own} "
           f"is not those rows (median row cosine {_cos(cmp.median_cos)} over {cmp.rows} sampled rows): the decoder "
           "layer learned against the target's head and is served with another, so its logits rank the wrong tokens.")
    return [Finding("lm-head-not-target", "error", msg,
                    fix="Re-export the drafter with lm_head = target lm_head[t2d] (what the trainer trained against).",
                    source=trainer_source or HEAD_SOURCE, impact="collapse")], "", data


def run(art: Artifacts) -> CheckResult:
    findings, note_e, data_e = check_embedding(art)
    more, note_h, data_h = check_head(art)
    notes = [n for n in (note_e, note_h) if n]
    return CheckResult(tuple(findings + more), "; ".join(notes), {**data_e, **data_h})


CHECK = register(Check("embedding", "the drafter's own embedding and head against the target's",
                       ("embedding-random", "embedding-not-target", "lm-head-not-target"), ("drafter", "target"), run,
                       order=40))
