"""``eagleforensics config DRAFT --engine E``: which ids an engine reads from a drafter config, and the traps."""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from ..errors import printable
from .common import echo_text, rule_options, run_guarded

if TYPE_CHECKING:
    from ..engines.draftconfig import ConfigAudit

ENGINE_CHOICES = ("sglang", "vllm", "trtllm")


def render_audit(audit: "ConfigAudit") -> str:
    """Readable text: where the ids came from, an id -> position table, then the findings."""
    source = audit.key_read or ("none: no aux capture" if audit.capture_off else "none found: engine default")
    assumed = " (no --engine-version: the newest release the rules know)" if audit.version_assumed else ""
    lines = [
        f"draft:  {printable(audit.path)}",
        f"engine: {audit.engine} -> rule {audit.rule}{assumed}; model_type "
        f"{audit.model_type or 'unknown'}; N={audit.num_layers}",
        f"ids:    {audit.ids_used}  (read from: {source})",
        f"serves: {', '.join(q.label for q in audit.served) or 'nothing'}  (concatenation order)",
        "",
        f"  {'id':>5}  {'position':<16} what it holds",
    ]
    for k, pos, note in zip(audit.ids_used, audit.positions, audit.notes):
        label = pos.label if pos is not None else "-- nothing --"
        what = pos.describe(audit.num_layers) if pos is not None else (note or "")
        lines.append(f"  {k:>5}  {label:<16} {what}")
    if audit.by_version:
        from ..engines.draftconfig import same_positions

        same = same_positions(audit.by_version)
        served = ", ".join(audit.by_version[0]["served"]) or "nothing"
        lines += ["", f"by version (the same for every version: {served}; only where the ids come from changes):"
                  if same else "by version (the answer changes):"]
        for row in audit.by_version:
            what = ("no EAGLE-3 capture" if not row["supported"] else "no aux capture" if row["capture_off"]
                    else f"{', '.join(row['served']) or 'nothing'} (from {row['key_read'] or 'its default'})")
            lines.append(f"  {row['versions']:<28} {what}")
    warnings = [f for f in audit.findings if f.severity == "warning"]
    infos = [f for f in audit.findings if f.severity != "warning"]
    for title, group in (("warnings", warnings), ("notes", infos)):
        if group:
            lines += ["", f"{title}:"] + [f"  [{f.code}] {f.message}" for f in group]
    if not warnings:
        lines += ["", "ok: no warnings"]
    return "\n".join(lines)


@click.command(name="config")
@click.argument("draft", type=click.Path())
@click.option("--engine", type=click.Choice(ENGINE_CHOICES), required=True,
              help="Serving engine whose reading of the config to audit.")
@rule_options
@click.option("--num-layers", type=click.IntRange(min=1), default=None, help="N, the target's num_hidden_layers.")
@click.option("--target", "target_dir", type=click.Path(), default=None,
              help="Target model directory (or its config.json) for N and model_type.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def config(draft: str, engine: str, engine_version: str | None, vllm_runner: str | None,
           model_type: str | None, num_layers: int | None, target_dir: str | None, as_json: bool) -> None:
    """Say which ids ENGINE reads from the DRAFT config (file or directory) and what they capture.

    Exit 0: no warning. 1: at least one warning-level finding. 2: bad input.
    """
    from ..engines.draftconfig import audit_config

    audit = run_guarded(lambda: audit_config(
        draft, engine, engine_version=engine_version, model_type=model_type,
        num_layers=num_layers, target_path=target_dir, vllm_runner=vllm_runner))
    echo_text(json.dumps(audit.to_dict(), indent=2) if as_json else render_audit(audit))
    sys.exit(1 if audit.has_warnings else 0)
