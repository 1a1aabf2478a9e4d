"""The server's launch, from its log: the arguments line (``engines.serverargs``) and the decode statistics lines.

``algorithm-mismatch``: an EAGLE-3 drafter launched as EAGLE (SGLang) / ``eagle`` (vLLM): no aux
states are captured and fc is skipped (SGLang) or the drafter is built as EAGLE-1 (vLLM); or
another algorithm, or none, for an EAGLE-3 drafter. ``draft-path-missing``: no draft path
(SGLang >= 0.4.7 loads the target as its own draft; vLLM refuses at start). ``draft-is-target``:
the draft path is the target's. ``pp-drops-aux``: pipeline parallelism on a release whose
non-last stages drop the aux states they capture. ``accept-len-one``: accept length 1.00 on every
decode line, which a weak drafter never gives (it accepts sometimes): the drafter's drafts are
structurally never the target's token. ``engine-refused``: the engine refused to start or died after
the last arguments line (its own failure lines, ``engines.failurelines``, each cited: vLLM's "Model does
not support EAGLE3 interface", "EngineCore failed to start", SGLang's "Scheduler hit an exception", a
traceback ending the log); the line is quoted. Engine facts: ``engines.launchrules`` (each row cites the
wheel file); threads: sgl-project/sglang#21272, #36528, #39644, vllm-project/vllm#22333, #36151,
#36731, #50514 (docs/causes.md rows 12, 14).
"""
from __future__ import annotations

import math
from pathlib import PurePosixPath
from typing import Any

from ..engines.failurelines import log_failure
from ..engines.launchrules import aux_survives_pp, eagle3_algorithm, launch_fact, pp_stage_of_position
from ..engines.modelclasses import eagle3_at
from ..engines.rules import ENGINE_NAMES
from ..errors import ForensicsError, printable
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .drafterfacts import draft_facts, drafter_tensor, target_facts
from .engineembed import engine_label
from .mtpweights import declared_mtp
from .registry import register
from .targetkind import architecture, hybrid_layout, multimodal_layout

ALGO_SOURCE = "sgl-project/sglang#21272 (docs/causes.md row 14)"
PATH_SOURCE = "sgl-project/sglang#36528, vllm-project/vllm#22333 (docs/causes.md row 14)"
PP_SOURCE = "vllm-project/vllm#36151, vllm-project/vllm#36731, vllm-project/vllm#50514, sgl-project/sglang#39644 " \
            "(docs/causes.md row 12)"
ONE_SOURCE = "sgl-project/sglang#21272, lightseekorg/tokenspeed#526 (docs/causes.md rows 1, 14)"
DRAFTING = ("eagle", "eagle3")  # the algorithms that load a separate drafter
MIN_LINES = 3  # fewer decode lines than this and "every line is 1.00" says little
ONE = 1.005  # an accept length at or below this is 1.00 as printed


def is_eagle3(art: Artifacts) -> tuple[bool | None, str]:
    """Whether the drafter is an EAGLE-3 one (aux states into fc), None unknown: from its fc width first (structure),
    then its config's own words (``speculators_model_type``, an architecture the engines load as EAGLE-3)."""
    if not art.available("draft_config"):
        return None, ""
    cfg = art.draft_config
    facts = draft_facts(cfg)
    if art.available("drafter"):
        fc = drafter_tensor(art.drafter.tensors, "fc.weight")
        h = facts.target_hidden_size
        if fc is not None and h and len(art.drafter.tensors[fc].shape) == 2 and \
                art.drafter.tensors[fc].shape[1] >= 2 * h and art.drafter.tensors[fc].shape[1] % h == 0:
            return True, f"its fc reads {art.drafter.tensors[fc].shape[1]} = {art.drafter.tensors[fc].shape[1] // h} x {h} features"
    if str(cfg.get("speculators_model_type", "")).lower() == "eagle3":
        return True, "speculators_model_type eagle3"
    archs = [a for a in facts.architectures if "eagle3" in a.lower()]  # the drafter's own class name, as engines read it
    if archs:
        return True, f"its architectures say {archs[0]}"
    return None, ""


def _same_path(a: str, b: str) -> bool:
    def norm(p: str) -> str:
        return str(PurePosixPath(p.strip().rstrip("/"))).lower()
    return norm(a) == norm(b)


NEXTN_SOURCE = ("sglang 0.4.10, 0.5.8 - 0.5.18 srt/server_args.py (NEXTN becomes EAGLE; DeepSeek MTP takes the "
                "target's path as the draft), 0.5.19+ srt/arg_groups/speculative_hook.py")


def logged_nextn(art: Artifacts) -> str:
    """How a SGLang launch logged as EAGLE is really NEXTN: the draft is the target (or none) and the target declares
    MTP layers (SGLang turns NEXTN into EAGLE in its arguments and sets the draft path to the target's); "" else."""
    args = art.server_args
    if args.engine != "sglang" or args.algorithm != "eagle" or not art.available("target"):
        return ""
    if args.draft and not (args.model and _same_path(args.draft, args.model)):
        return ""
    mtp = declared_mtp(art.target.config)
    if mtp is None:
        return ""
    return (f"its config declares {mtp[0]} = {mtp[1]}; SGLang logs NEXTN as EAGLE with the target as its own draft, "
            f"{NEXTN_SOURCE}")


def check_algorithm(art: Artifacts, name: str) -> list[Finding]:
    args = art.server_args
    eagle3, why = is_eagle3(art)
    want = eagle3_algorithm(args.engine, art.engine_version) or ("EAGLE3" if args.engine == "sglang" else "eagle3")
    got = args.algorithm_raw or args.algorithm
    if args.algorithm == "eagle3":
        return []
    if args.algorithm is None:
        if eagle3 is False:
            return []
        return [Finding("algorithm-mismatch", "warning",
                        f"{name} was started without a speculative algorithm: it does not speculate at all, so there "
                        "is no acceptance to speak of.", fix=f"Relaunch with the speculative algorithm {want} and the "
                        "drafter's path.", source=ALGO_SOURCE, impact="collapse")]
    if args.algorithm == "eagle" and (nextn := logged_nextn(art)):
        if eagle3:
            return [Finding("algorithm-mismatch", "warning",
                            f"{name} runs the target's own MTP layers ({nextn}), not the EAGLE-3 drafter given "
                            f"({why}): the drafter is not served at all.",
                            fix=f"To serve the EAGLE-3 drafter, relaunch with {want} and its path as the draft model.",
                            source=f"{NEXTN_SOURCE}; {ALGO_SOURCE}", impact="low")]
        return []
    if args.algorithm == "eagle":
        fact = launch_fact("eagle-for-eagle3", args.engine, art.engine_version)
        detail = fact.detail if fact is not None else "no aux states are captured"
        source = f"{fact.source}; {ALGO_SOURCE}" if fact is not None else ALGO_SOURCE
        if eagle3:
            return [Finding("algorithm-mismatch", "error",
                            f"{name} was launched with {got} but the drafter is EAGLE-3 ({why}): {detail}.",
                            fix=f"Relaunch with the speculative algorithm {want}.", source=source, impact="collapse")]
        if eagle3 is None:
            return [Finding("algorithm-mismatch", "warning",
                            f"{name} was launched with {got}; if the drafter is an EAGLE-3 one (pass --drafter or "
                            f"--draft-config to know), {detail}.", fix=f"Relaunch with {want} if it is EAGLE-3.",
                            source=source, impact="collapse")]
        return []
    if eagle3:
        return [Finding("algorithm-mismatch", "error",
                        f"{name} was launched with {got} but the drafter is EAGLE-3 ({why}): the drafter is not used "
                        "as one.", fix=f"Relaunch with the speculative algorithm {want}.", source=ALGO_SOURCE,
                        impact="collapse")]
    return []


def check_draft_path(art: Artifacts, name: str) -> list[Finding]:
    args = art.server_args
    if args.algorithm not in DRAFTING:
        return []
    if not args.draft:
        fact = launch_fact("draft-path-missing", args.engine, art.engine_version, art.model_type)
        detail = fact.detail if fact is not None else "the engine has no drafter to load"
        source = f"{fact.source}; {PATH_SOURCE}" if fact is not None else PATH_SOURCE
        return [Finding("draft-path-missing", "error",
                        f"{name} was launched with {args.algorithm_raw or args.algorithm} and no draft model path: "
                        f"{detail}.", fix="Relaunch with the drafter's directory as the draft model path "
                        "(SGLang --speculative-draft-model-path, vLLM speculative_config.model).",
                        source=source, impact="collapse")]
    return []


def check_draft_is_target(art: Artifacts, name: str) -> list[Finding]:
    args = art.server_args
    if args.algorithm not in DRAFTING or not args.draft or not args.model or not _same_path(args.draft, args.model):
        return []
    shown = printable(args.draft)
    if args.algorithm == "eagle" and args.engine == "sglang":
        # SGLang turns NEXTN into EAGLE and gives MTP targets their own path as draft by design
        return [Finding("draft-is-target", "info",
                        f"{name} uses the target ({shown}) as its own draft: right for an MTP/NEXTN target "
                        "(SGLang logs NEXTN as EAGLE and sets the draft path to the target's), wrong for any other.",
                        source=PATH_SOURCE, impact="low")]
    return [Finding("draft-is-target", "error",
                    f"{name} was given the target itself ({shown}) as the draft model: the target is loaded as its "
                    "own drafter, which has no fc for aux states and drafts nothing the target accepts as an "
                    "EAGLE-3 drafter would.", fix="Point the draft model path at the drafter's directory.",
                    source=PATH_SOURCE, impact="collapse")]


def _served_positions(art: Artifacts, num_layers: int) -> list[int] | None:
    from ..engines.crosscheck import serving_audit

    draft = art.inputs.draft_config or (str(art.drafter.path / "config.json") if art.available("drafter") else None)
    try:
        audit = serving_audit(draft, art.engine, num_layers, engine_version=art.engine_version,
                              model_type=art.model_type, vllm_runner=art.vllm_runner)
    except ForensicsError:
        return None
    return [p.p for p in audit.positions if p is not None]


def check_pp(art: Artifacts, name: str) -> tuple[list[Finding], dict[str, Any]]:
    args = art.server_args
    if args.algorithm != "eagle3" or not args.pp or args.pp <= 1:
        return [], {}
    mtype = art.model_type
    survives, detail = aux_survives_pp(args.engine, art.engine_version, mtype)
    data: dict[str, Any] = {"pp": args.pp, "aux_survive": survives}
    if survives is True:
        return [], data
    if survives is None:
        return [Finding("pp-drops-aux", "info", f"{name} with pp_size={args.pp}: {detail}.", source=PP_SOURCE,
                        impact="low")], data
    n = target_facts(art.target.config).num_layers if art.available("target") else None
    lost = ""
    if n:
        served = _served_positions(art, n)
        if served:
            stages = {p: pp_stage_of_position(args.engine, art.engine_version, n, args.pp, p, mtype) for p in served}
            dropped = [p for p, s in stages.items() if s is not None and s != args.pp - 1]
            data.update({"served_positions": served, "stages": {str(p): s for p, s in stages.items()},
                         "dropped": dropped})
            if dropped:
                lost = (f": of the positions the drafter is fed (p={served}), "
                        + ", ".join(f"p{p} (stage {stages[p]})" for p in dropped)
                        + (" is" if len(dropped) == 1 else " are") + f" captured before the last stage "
                        f"(stage {args.pp - 1}), so the drafter gets at most {len(served) - len(dropped)} of its "
                        f"{len(served)} states as trained")
            else:
                return [], data
    return [Finding("pp-drops-aux", "error",
                    f"{name} runs pipeline parallelism (pp_size={args.pp}) on a release that drops aux states from "
                    f"non-last stages{lost}; expect acceptance near zero. {detail}.",
                    fix="Serve with pipeline parallelism 1 (use tensor parallelism), or a release that forwards aux "
                        "states across stages (vLLM >= 0.30.0).", source=PP_SOURCE, impact="collapse")], data


def check_accept_len(art: Artifacts, name: str) -> tuple[list[Finding], dict[str, Any]]:
    df = art.server_log
    if "accept_length" not in df.columns:
        return [], {}
    from .specoff import explained_lines  # lines a run-time switch left undrafted are not the drafter's

    off = explained_lines(df, art.server_args, art.engine_version)
    if len(off):
        df = df[~df["line"].isin(off["line"])]
    values = [float(v) for v in df["accept_length"].tolist() if v is not None and not math.isnan(float(v))]
    data = {"decode_lines": len(values), "undrafted_lines_left_out": int(len(off))}
    if not values:
        return [], data
    ones = sum(v <= ONE for v in values)
    data["accept_len_one"] = ones
    if ones == len(values) and len(values) >= MIN_LINES:
        return [Finding("accept-len-one", "error",
                        f"accept length is 1.00 on all {len(values)} decode lines of the log: no draft token is ever "
                        "accepted. A weak drafter still accepts sometimes; this is structural (a wrong algorithm or "
                        "draft path, a missing or absolute d2t, aux states the drafter never sees, PP dropping them).",
                        fix="Look at the other findings for the cause (the launch arguments, d2t, the wiring); "
                            "each is structural.", source=ONE_SOURCE, impact="collapse")], data
    return [], data


REFUSE_SOURCE = "the engine's own failure lines (docs/serving-causes.md, engine-refused)"
KIND_TEXT = {"eagle3-refused": "refused EAGLE-3 at start: the target's model class in this release has no aux-state "
                               "capture, so no token was ever served with the drafter",
             "start-failed": "failed to start", "died": "died after starting",
             "traceback": "stopped at start with a Python error"}


def class_refuses(art: Artifacts, name: str) -> tuple[list[Finding], dict[str, Any]]:
    """An EAGLE-3 launch on a release whose model class for the target has no aux capture (``engines.modelclasses``),
    when the log shows no failure line (cut short): the launch cannot have started. Hybrid and multimodal targets
    are left to their own checks, which say the same with their layout."""
    args = art.server_args
    if args.algorithm != "eagle3" or not art.available("target") or art.engine_version is None:
        return [], {}
    cfg = art.target.config
    if hybrid_layout(cfg) is not None or multimodal_layout(cfg) is not None:
        return [], {}
    arch = architecture(cfg)
    status, row = eagle3_at(args.engine, art.engine_version, arch)
    if status not in ("no", "unregistered"):
        return [], {}
    what = "has no EAGLE-3 capture for" if status == "no" else "does not register"
    return [Finding("engine-refused", "error", f"{name} {what} {arch} ({row}): the launch fails at start when EAGLE-3 "
                    "is asked for, though this log shows no failure line (cut short?).",
                    fix="Serve this target on a release whose model class captures aux states, or without EAGLE-3.",
                    source=f"{row}; {REFUSE_SOURCE}", impact="collapse")], {"class_refuses": status}


def check_failure(art: Artifacts, name: str, after: int) -> tuple[list[Finding], dict[str, Any]]:
    """The engine's own refusal or death after the last arguments line, with the line quoted."""
    fail = log_failure(art.inputs.log, after) if art.inputs.log else None
    if fail is None:
        return class_refuses(art, name) if art.server_args is not None and after else ([], {})
    quoted = printable(fail.line[:300])
    err = ""
    if fail.error and fail.error != fail.line:
        err = f"; the error that ended it (line {fail.error_line_no}): {printable(fail.error[:300])!r}"
    data = {"failure": {"kind": fail.kind, "line": fail.line_no, "text": fail.line[:300],
                        "error": (fail.error or "")[:300] or None, "source": fail.source}}
    fix = ("Serve this target on a release whose model class captures aux states (doctor --target with "
           "--engine-version says which), or without EAGLE-3." if fail.kind == "eagle3-refused" else
           "Read the error above the quoted line in the log and fix it before judging acceptance: no decode "
           "statistics of this start exist.")
    return [Finding("engine-refused", "error", f"{name} {KIND_TEXT[fail.kind]} (line {fail.line_no}: {quoted!r}"
                    f"{err}).", fix=fix, source=f"{fail.source}; {REFUSE_SOURCE}", impact="collapse")], data


def run(art: Artifacts) -> CheckResult:
    """Every launch check the log allows; a log with no arguments line still gives the decode-line check."""
    args = art.server_args
    findings: list[Finding] = []
    data: dict[str, Any] = {}
    notes = []
    if args is None:
        notes.append("the log has no arguments line (the launch checks need one)")
        failed, fail_data = check_failure(art, "the server", 0)
        findings += failed
        data.update(fail_data)
    else:
        if art.inputs.engine is not None and art.inputs.engine != args.engine:
            raise ForensicsError(f"--engine {art.inputs.engine} but the log is a {ENGINE_NAMES[args.engine]} server's",
                                 path=art.inputs.log)
        _, _, name = engine_label(art)
        data["server"] = {"engine": args.engine, "version": art.engine_version, "algorithm": args.algorithm_raw,
                          "draft": args.draft, "model": args.model, "pp": args.pp, "tp": args.tp,
                          "max_len": args.max_len, "line": args.line_no}
        findings += check_algorithm(art, name) + check_draft_path(art, name) + check_draft_is_target(art, name)
        pp, pp_data = check_pp(art, name)
        findings += pp
        data.update(pp_data)
        failed, fail_data = check_failure(art, name, args.line_no or 0)
        findings += failed
        data.update(fail_data)
        notes.append(f"server started with {args.describe()}" + (
            f"; it {KIND_TEXT[fail_data['failure']['kind']].split(':')[0]} (line {fail_data['failure']['line']})"
            if "failure" in fail_data else ""))
    more, acc = check_accept_len(art, "")
    findings += more
    data.update(acc)
    if acc.get("decode_lines"):
        notes.append(f"{acc['decode_lines']} decode lines, {acc.get('accept_len_one', 0)} at accept length 1.00")
    else:
        notes.append("no decode statistics lines yet")
    return CheckResult(tuple(findings), "; ".join(notes), data)


CHECK = register(Check("launch", "the server's launch arguments and decode lines (--log)",
                       ("algorithm-mismatch", "draft-path-missing", "draft-is-target", "pp-drops-aux",
                        "accept-len-one", "engine-refused"), ("log",), run, order=5))
