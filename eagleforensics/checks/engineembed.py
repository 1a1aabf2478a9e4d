"""The engine and trainer rules (``engines.embedrules``, ``engines.roperules``) applied to one drafter and one engine.

Whose embedding the served drafter reads, whether the trainer that wrote it copies and freezes
the target's head (then a head unlike the target's is a defect), and what the engine does with a
draft ``max_position_embeddings`` below the served length. With no ``--engine`` the engine's
choice is unknown (None) and checks say so rather than guess; with no ``--engine-version`` the
newest release the tables read is assumed, and the text says so.
"""
from __future__ import annotations

from ..engines.embedrules import embed_rule, trainer_rule
from ..engines.roperules import draft_rope_rule, rope_kind
from ..engines.rules import ENGINE_NAMES, NEWEST, default_runner
from ..errors import ForensicsError
from .base import Artifacts
from .drafterfacts import draft_facts


def engine_label(art: Artifacts) -> tuple[str, str | None, str]:
    """(version, vLLM runner, a phrase naming the engine) with the newest version / default runner filled in."""
    engine = art.engine or ""
    version = art.engine_version or NEWEST.get(engine, "")
    runner = art.vllm_runner
    assumed = []
    if art.engine_version is None:
        assumed.append(f"version {version} assumed (the newest the rules read; pass --engine-version)")
    elif art.engine_version_from:
        assumed.append(f"version from {art.engine_version_from}")
    if engine == "vllm" and runner is None:
        runner = default_runner(version, None)[0]
        assumed.append(f"{runner} runner assumed (pass --vllm-runner)")
    elif engine == "vllm" and art.vllm_runner_from:
        assumed.append(f"{runner} runner: {art.vllm_runner_from}")
    name = f"{ENGINE_NAMES.get(engine, engine)} {version}".strip()
    if engine == "vllm":
        name += f" ({runner} runner)"
    return version, runner, name + (f" [{'; '.join(assumed)}]" if assumed else "")


def uses_own_embedding(art: Artifacts) -> tuple[bool | None, str, str]:
    """(True: the engine embeds with the drafter's own matrix, False: with the target's, None: unknown; the rule
    in words; its source)."""
    if art.engine is None:
        return None, "", ""
    version, runner, name = engine_label(art)
    try:
        rule = embed_rule(art.engine, version, runner)
    except ForensicsError as exc:  # a version older than the table, a runner without an EAGLE path
        return None, f"{name}: {exc.detail}", ""
    d = draft_facts(art.drafter.config)
    widths_differ = bool(d.hidden_size and d.target_hidden_size and d.hidden_size != d.target_hidden_size)
    used = rule.embedding_used(has_own=True, widths_differ=widths_differ)
    if used not in ("draft", "target"):
        return None, f"{name} was not read for this", rule.source
    return used == "draft", f"{name} embeds with the {used}'s matrix ({rule.embed_note})", rule.source


def trainer_of(art: Artifacts) -> tuple[str, str | None]:
    """The trainer that wrote the drafter, as far as its layout tells (speculators, else SpecForge), and version."""
    facts = draft_facts(art.drafter.config)
    if facts.layout == "speculators" or art.drafter.config.get("speculators_model_type") is not None:
        version = art.drafter.config.get("speculators_version")
        return "speculators", version if isinstance(version, str) else None
    return "specforge", None


def trainer_copies_head(art: Artifacts) -> tuple[bool, str, str]:
    """(whether the trainer copies and freezes the target's lm_head rows, the trainer in words, the rule's source)."""
    trainer, version = trainer_of(art)
    try:
        rule = trainer_rule(trainer, version)
    except ForensicsError:
        rule = trainer_rule(trainer)
        version = None
    name = {"specforge": "SpecForge", "speculators": "speculators"}[trainer] + (f" {version}" if version else "")
    return rule.head_is_target_copy is True, name, rule.source


def draft_max_positions_rule(art: Artifacts) -> tuple[str, str, str]:
    """What the engine does with a draft max_position_embeddings below the served length: (effect, rule, source).

    ``effect``: ``applies`` (positions past it are wrong or get no drafts), ``refuses`` (the server will not
    start), ``caps`` (the served length is cut to the draft's), ``raises`` (lifted to the target's: no cost),
    ``unknown``.
    """
    if art.engine is None:
        return "unknown", "", ""
    version, runner, name = engine_label(art)
    layer = draft_facts(art.draft_config).layer
    try:
        rule = draft_rope_rule(art.engine, version, runner, rope_kind(layer))
    except ForensicsError as exc:
        return "unknown", f"{name}: {exc.detail}", ""
    if rule is None:
        return "unknown", f"{name}: not read", ""
    effect = {"out-of-bounds": "applies", "no-drafts": "applies", "refuse-at-start": "refuses",
              "target-capped": "caps", "raised": "raises"}.get(rule.past_max, "unknown")
    return effect, f"{name}: {rule.consequence}", rule.source
