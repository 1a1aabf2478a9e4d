"""Speculation switched off or shortened at run time (docs/causes.md row 34).

``spec-switched-off``: the arguments line turns speculation off or shortens it by batch size (vLLM
``disable_by_batch_size`` on the V0 engine, ``num_speculative_tokens_per_batch_size`` from 0.33.0; SGLang
``speculative_adaptive``; rows in ``engines.runtimerules``). Decode lines at those batch sizes read accept
length 1.00 (mit-han-lab/fastrl#4: ``accept len: 1.00`` at #running-req 48) or shorter chains; throughput
falls with concurrency (vllm-project/vllm#49548: 232 -> 24-157 tok/s at 8 requests). Those lines are the
engine's choice, not the drafter's: ``launch``'s ``accept-len-one`` and ``plan`` leave them out
(``explained_lines``). Info when the setting is on and the log shows no such line; warning when some lines are
undrafted (the speed-up measured there is not the drafter's). Cause: the serving configuration.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from ..engines.acceptlines import decode_points, spec_off_lines
from ..engines.runtimerules import spec_off_setting, undrafted_lines
from ..errors import printable
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register

SOURCE = "mit-han-lab/fastrl#4, vllm-project/vllm#49548 (docs/causes.md row 34)"
CAUSE = "speculation switched off by the serving configuration"


def explained_lines(df: pd.DataFrame, args: Any, version: str | None) -> pd.DataFrame:
    """The decode lines of ``df`` (parsed log) whose accept length 1.00 a run-time switch explains."""
    return undrafted_lines(df, args, version)


def run(art: Artifacts) -> CheckResult:
    """Read the run-time switches and count the decode lines they leave undrafted."""
    args = art.server_args
    if args is None:
        return CheckResult(skipped="the log has no arguments line (the run-time switches are read from it)")
    if not args.speculative:
        return CheckResult((), "the server does not speculate", {})
    setting = spec_off_setting(args, art.engine_version)
    if setting is None:
        return CheckResult((), "no setting switches speculation off by batch size", {"cause": CAUSE})
    points = decode_points(art.server_log)
    off = spec_off_lines(points, setting.explains)
    rule = setting.rule
    how = f" ({rule.detail}; {rule.source})" if rule else " (not read for this release)"
    data: dict[str, Any] = {"setting": setting.text, "off_from": setting.off_from, "maybe_from": setting.maybe_from,
                            "lines": int(len(points)), "undrafted_lines": int(len(off)), "cause": CAUSE,
                            "rule": None if rule is None else {"span": rule.span(), "outcome": rule.outcome}}
    source = f"{rule.source}; {SOURCE}" if rule else SOURCE
    fix = ("Compare acceptance on lines below that batch size only (doctor and plan already leave the undrafted "
           "ones out), or turn the setting off while measuring the drafter.")
    if rule is not None and rule.outcome == "accepted-unused":
        return CheckResult((Finding("spec-switched-off", "info", printable(
            f"{setting.text} is set, but this release's V1 engine never reads it{how}: speculation stays on at "
            "every batch size."), source=source, impact="low"),), setting.text, data)
    if len(off):
        at = sorted({int(r) for r in off["running"].dropna()})
        msg = (f"{len(off)} of {len(points)} decode lines read accept length 1.00 at {min(at)}-{max(at)} running "
               f"requests, where {setting.text} lets the engine run without drafts{how}. Those lines measure no "
               "drafter: they are left out of accept-len-one and plan's fits; acceptance and speed-up there are "
               "the switch's, not the drafter's.")
        return CheckResult((Finding("spec-switched-off", "warning", printable(msg), fix=fix, source=source,
                                    impact="medium"),), setting.text, data)
    start = setting.maybe_from if setting.maybe_from is not None else setting.off_from
    where = f"from {start} running requests" if start is not None else "as acceptance moves"
    msg = (f"{setting.text}: the engine may draft fewer tokens or none {where}{how}; no decode line of this log "
           "shows an undrafted batch.")
    return CheckResult((Finding("spec-switched-off", "info", printable(msg), source=source, impact="low"),),
                       setting.text, data)


CHECK = register(Check("spec-off", "speculation switched off or shortened by batch size at run time (--log)",
                       ("spec-switched-off",), ("log",), run, order=64))
