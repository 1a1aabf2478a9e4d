"""The registry of doctor checks: each check module registers itself on import; ``all_checks`` imports them all.

A new cause is one new module here plus its name in ``MODULES``; the doctor pipeline, the CLI
and the report pick it up without edits. Names and finding codes must be unique across checks
(a duplicate is a bug, raised at import).
"""
from __future__ import annotations

from importlib import import_module

from .base import Check

# check modules, in the order their rows are listed when clean or not run
MODULES: tuple[str, ...] = ("launch", "drafterweights", "drafterbaseline", "sizes", "vocabmap", "coverage", "embedding",
                           "flags", "rope", "template", "dataorigin", "datashape",
                           "targetquant", "mtpweights", "hybrid", "multimodal", "verifier", "datasize",
                           "penalty", "lora", "dpattention", "benchprompts",
                           "draftercache", "specoff", "batchdep", "depth", "blockdrafter", "auxrange", "defaulttemp", "cumulative", "arfusion")
_CHECKS: dict[str, Check] = {}


def register(check: Check) -> Check:
    """Add ``check`` to the registry (at its module's import); returns it so a module can keep a name for it."""
    if check.name in _CHECKS and _CHECKS[check.name] is not check:
        raise ValueError(f"two doctor checks are named {check.name!r}")
    taken = {code: other.name for other in _CHECKS.values() if other.name != check.name for code in other.codes}
    clash = [code for code in check.codes if code in taken]
    if clash:
        raise ValueError(f"check {check.name!r} reuses finding codes {clash} of {sorted({taken[c] for c in clash})}")
    _CHECKS[check.name] = check
    return check


def all_checks() -> list[Check]:
    """Every registered check (importing the check modules on first call), in display order."""
    for name in MODULES:
        import_module(f"{__package__}.{name}")
    return sorted(_CHECKS.values(), key=lambda c: (c.order, c.name))


def get_check(name: str) -> Check:
    """The check named ``name``; an unknown name is a ValueError that lists the known ones."""
    checks = {c.name: c for c in all_checks()}
    if name not in checks:
        raise ValueError(f"no doctor check named {name!r}; known: {', '.join(sorted(checks))}")
    return checks[name]


def all_codes() -> dict[str, str]:
    """finding code -> the check that emits it (the contract the README documents)."""
    return {code: c.name for c in all_checks() for code in c.codes}
