"""Whose embedding and head the served drafter uses, and whether its trainer copies the target's head.

The doctor's view of the engine and trainer rules for one drafter (the rules themselves are data in
``engines``). Until the per-engine embedding table lands, the engine's choice is unknown (None), so
an own embedding unlike the target's is a warning, never an error.
"""
from __future__ import annotations

from .base import Artifacts
from .drafterfacts import draft_facts


def uses_own_embedding(art: Artifacts) -> tuple[bool | None, str]:
    """(True: the engine embeds with the drafter's own matrix, False: with the target's, None: unknown; the rule)."""
    return None, ""


def trainer_copies_head(art: Artifacts) -> tuple[bool, str]:
    """(whether the trainer that wrote this drafter copies and freezes the target's lm_head rows, its name)."""
    facts = draft_facts(art.drafter.config)
    if facts.layout == "speculators":
        return True, "speculators"
    return False, "SpecForge"


def draft_max_positions_rule(art: Artifacts) -> tuple[str, str, str]:
    """What the engine does with a draft max_position_embeddings below the served length: (effect, rule, source)."""
    return "unknown", "", ""
