"""Drafter replay for people: which wirings to try, running them on a capture, and the result's text/JSON forms.

The wirings come from the rest of the workbench: the positions the training record holds (``align``),
the engines' default ([2, N//2, N-3]), what ``--engine`` reads from the draft config (the drafter's
own config.json unless another is given), and any ``--wiring`` the user names. Each is replayed by
``evidence.replay`` on the capture; the target's next tokens come from its lm_head on the capture's
post-norm final state (read from the target's shards), else from the capture's own ids.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..arrays import to_torch
from ..errors import ForensicsError
from ..positions import Position, default_aux_positions
from ..results import Finding

if TYPE_CHECKING:  # pragma: no cover
    from ..evidence.replay import WiringReplay
    from ..io.capture import Capture
    from ..results import AlignmentResult

SCHEMA = "eagleforensics-replay-v1"
DEFAULT_STEPS = 3
DEFAULT_COST_RATIO = 0.05


@dataclass(frozen=True)
class Wiring:
    """Positions fed to the drafter's fc, in slot order, and who feeds them."""

    positions: tuple[Position, ...]
    sources: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return ",".join(p.label.replace(" post-norm", "n") for p in self.positions)


def parse_wiring(text: str) -> tuple[Position, ...]:
    """``p3,p7,p10`` or ``3,7,10`` (``12n`` = post-norm) -> positions; ForensicsError naming the option otherwise."""
    out = []
    for part in str(text).replace(" ", "").split(","):
        body = part[1:] if part[:1] in ("p", "P") else part
        normed = body.endswith("n")
        body = body[:-1] if normed else body
        if not (body.isascii() and body.isdigit() and len(body) <= 6):  # not '²' (isdigit, yet int() refuses it)
            raise ForensicsError(f"--wiring {str(text)[:60]!r}: {part[:20]!r} is not a position (write p3,p7,p10 or "
                                 "3,7,10)")
        out.append(Position(int(body), normed))
    if not out:
        raise ForensicsError(f"--wiring {text!r} names no position")
    return tuple(out)


def collect_wirings(num_layers: int, *, trained: list[Position] | None = None, engine_positions: list[Position] | None
                    = None, engine_label: str | None = None, given: list[tuple[Position, ...]] = ()) -> list[Wiring]:
    """The wirings to replay, each once (sources merged when two name the same positions), trained first."""
    found: dict[tuple[Position, ...], tuple[list[str], list[str]]] = {}

    def add(ps: tuple[Position, ...], source: str, note: str = "") -> None:
        srcs, notes = found.setdefault(ps, ([], []))
        if source not in srcs:
            srcs.append(source)
        if note:
            notes.append(note)

    if trained:
        add(tuple(trained), "trained", "the positions the training record holds (align)")
    add(tuple(Position(p) for p in default_aux_positions(num_layers)), "engine default",
        "what SGLang, vLLM and TensorRT-LLM capture when no ids are set")
    if engine_positions:
        add(tuple(engine_positions), engine_label or "engine")
    for ps in given:
        add(tuple(ps), "given")
    return [Wiring(ps, tuple(s), tuple(n)) for ps, (s, n) in found.items()]


@dataclass(frozen=True)
class ReplayReport:
    """Every wiring's replay on one capture, with where the tokens came from and the findings."""

    drafter: str
    layout: str
    capture: str
    num_layers: int
    tokens: int
    steps: int
    cost_ratio: float
    token_source: str
    greedy_share: float | None
    wirings: list[Wiring]
    results: list[WiringReplay]
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    engine_check: bool = False

    @property
    def trained(self) -> WiringReplay | None:
        return next((r for r in self.results if "trained" in r.source.split("; ")), None)

    @property
    def best(self) -> WiringReplay | None:
        return max(self.results, key=lambda r: r.accept_length, default=None)

    @property
    def exit_code(self) -> int:
        """1 when an engine was checked and it would feed something other than the trained wiring, else 0."""
        if not self.engine_check or self.trained is None:
            return 0
        served = [r for r in self.results if any(s.startswith(("sglang", "vllm", "trtllm")) for s in r.source.split("; "))]
        return 1 if any(r is not self.trained for r in served) else 0

    @property
    def verdict(self) -> str:
        best, trained = self.best, self.trained
        if best is None:
            return "no wiring replayed"
        text = (f"best wiring {best.label}: accept length {best.accept_length:.2f} for a chain of {self.steps} "
                f"(step-1 acceptance {best.acc[0]:.0%})")
        if trained is not None and trained is not best:
            text += f"; the trained wiring {trained.label} gives {trained.accept_length:.2f}: check the replay inputs"
        elif trained is not None:
            worst = min(self.results, key=lambda r: r.accept_length)
            if worst is not trained:
                text += f"; the worst, {worst.label}, gives {worst.accept_length:.2f}"
        return text

    def to_dict(self) -> dict[str, Any]:
        trained = self.trained
        return {
            "schema": SCHEMA, "drafter": self.drafter, "layout": self.layout, "capture": self.capture,
            "num_layers": self.num_layers, "tokens": self.tokens, "steps": self.steps, "cost_ratio": self.cost_ratio,
            "token_source": self.token_source, "greedy_share": self.greedy_share,
            "trained": None if trained is None else trained.label, "verdict": self.verdict,
            "wirings": [r.to_dict(self.cost_ratio) for r in self.results],
            "findings": [f.to_dict() for f in self.findings], "seconds": round(self.seconds, 3),
            "exit_code": self.exit_code,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def to_text(self) -> str:
        lines = [f"drafter: {self.drafter} ({self.layout})",
                 f"capture: {self.capture} (N={self.num_layers}, {self.tokens} tokens)",
                 f"targets: {self.token_source}",
                 f"chain:   {self.steps} draft steps per start row; speed-up at draft/verify cost ratio {self.cost_ratio:g}",
                 "", f"VERDICT: {self.verdict}", ""]
        head = ["wiring", "source", "starts"] + [f"acc@{k}" for k in range(1, self.steps + 1)] + \
            [f"reach@{k}" for k in range(1, self.steps + 1)] + ["accept len", "speed-up"]
        rows = []
        for r in self.results:
            mark = "*" if r is self.trained else ""
            rows.append([r.label + mark, r.source, str(r.starts)] + [f"{a:.3f}" for a in r.acc] +
                        [f"{a:.3f}" for a in r.reach] + [f"{r.accept_length:.3f}", f"{r.speedup(self.cost_ratio):.2f}x"])
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)))
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
        lines.append("(* = the trained wiring; acc@k = step-k draft equals the target token, teacher-forced; "
                     "reach@k = steps 1..k all accepted; accept len = 1 + sum of reach)")
        if self.findings:
            lines += ["", "findings:"] + [f"  [{f.severity}] {f.code}: {f.message}" for f in self.findings]
        return "\n".join(lines)


def _aux(cap: Capture, positions: tuple[Position, ...]) -> Callable[[int, int], torch.Tensor]:
    """A reader of the wiring's concatenated states, rows a..b-1 (streamed from the file where it allows)."""
    missing = [p.label for p in positions if p not in cap.readers]
    if missing:
        raise ForensicsError(f"capture has no {', '.join(missing)} (it holds {', '.join(p.label for p in cap.positions)})",
                             path=cap.path)
    return lambda a, b: torch.cat([to_torch(cap.read_rows(p, a, b)).float() for p in positions], -1)


def target_next_tokens(cap: Capture, rows: int, target: Any | None, device: str) -> tuple[torch.Tensor, str, float | None,
                                                                                           list[Finding]]:
    """y[t] = the target's greedy token after row t; how it was obtained; share of rows whose next id equals it."""
    from ..evidence.replay import rms_norm, target_tokens

    ids = to_torch(cap.input_ids[:rows]).long()
    n = cap.num_layers
    findings: list[Finding] = []
    if target is not None and target.lm_head is not None:
        post = Position(n, True)
        if post in cap.readers:
            final = to_torch(cap.read_rows(post, 0, rows)).float()
            how = f"argmax of the target lm_head ({target.path}) on the capture's post-norm final state"
        elif Position(n) in cap.readers and target.norm is not None:
            final = rms_norm(to_torch(cap.read_rows(Position(n), 0, rows)), target.norm.float(), target.rms_norm_eps)
            how = f"argmax of the target lm_head on the capture's p{n} passed through the target's final norm"
        else:
            raise ForensicsError(f"capture has neither the post-norm final state nor p{n}: the target's next tokens "
                                 "cannot be computed", path=cap.path)
        if target.lm_head.shape[1] != final.shape[1]:
            raise ForensicsError(f"target lm_head is {list(target.lm_head.shape)}, the capture's states are "
                                 f"{final.shape[1]} wide", path=target.path)
        y = target_tokens(final, target.lm_head, device)
        share = float((ids[1:] == y[:-1]).float().mean()) if rows > 1 else None
        if share is not None and share < 0.9:
            findings.append(Finding("ids-not-greedy", "info", (
                f"only {share:.0%} of the capture's next ids are the target's own greedy token (a prompt, or sampled "
                "text): steps after the first are teacher-forced with the capture's ids, as the trainers' acc_k are; "
                "a server feeds the drafter its own accepted drafts instead")))
        return y, how, share, findings
    y = torch.cat([ids[1:], ids.new_full((1,), -1)])
    findings.append(Finding("tokens-assumed-greedy", "warning", (
        "no target lm_head (pass --target DIR): the capture's next ids were taken as the target's tokens, which "
        "holds only when the capture is the target's own greedy output")))
    return y, "the capture's own next ids (assumed to be the target's greedy output)", None, findings


def run_replay(drafter_dir: str | Path, capture: str | Path | Capture, *, target: str | Path | None = None,
               train: str | Path | AlignmentResult | None = None, wirings: list[str] = (), steps: int = DEFAULT_STEPS,
               cost_ratio: float = DEFAULT_COST_RATIO, engine: str | None = None, draft_config: str | Path | None = None,
               engine_version: str | None = None, model_type: str | None = None, device: str = "cpu",
               max_tokens: int | None = None, convention: str = "hf", allow_unsafe: bool = False) -> ReplayReport:
    """Replay the drafter on every wiring worth trying and score each against the target's next tokens."""
    from ..alignment import align
    from ..engines.crosscheck import check_request, serving_audit, trained_positions
    from ..evidence.replay import DraftForward, replay_wiring
    from ..io.capture import Capture, load_capture
    from ..io.drafter import load_drafter, load_target
    from ..results import AlignmentResult

    if steps < 1 or steps > 16:
        raise ForensicsError(f"--steps must be between 1 and 16, got {steps}")
    if not (cost_ratio >= 0 and cost_ratio < 10):
        raise ForensicsError(f"--cost-ratio must be a number in [0, 10), got {cost_ratio}")
    if device not in ("cpu", "cuda"):
        raise ForensicsError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ForensicsError("--device cuda asked for, but no CUDA device is visible")
    given = [parse_wiring(w) for w in wirings]
    if engine is not None and draft_config is None:
        draft_config = Path(drafter_dir) / "config.json"  # the drafter's own config is what a server reads
    check_request(draft_config, engine, engine_version, model_type)
    drafter = load_drafter(drafter_dir, target=target)
    head = load_target(target, embed=False) if target is not None else None
    if head is not None and head.lm_head is not None and head.lm_head.shape[0] != drafter.spec.vocab_size:
        raise ForensicsError(f"target lm_head has {head.lm_head.shape[0]} tokens; the drafter's config says the target "
                             f"vocabulary is {drafter.spec.vocab_size}: not this drafter's target", path=target)
    cap = capture if isinstance(capture, Capture) else load_capture(capture, convention=convention,
                                                                    allow_unsafe=allow_unsafe)
    if cap.num_layers is None:
        raise ForensicsError("capture does not say how many layers the target has", path=cap.path)
    if head is not None and head.num_layers is not None and head.num_layers != cap.num_layers:
        raise ForensicsError(f"capture holds the states of a {cap.num_layers}-layer model but the target has "
                             f"{head.num_layers} layers (a training record given as the capture? pass it as --train)",
                             path=cap.path)
    if cap.input_ids is None:
        raise ForensicsError("capture holds no input_ids: the drafter needs the tokens", path=cap.path)
    if cap.hidden_size != drafter.spec.target_hidden_size:
        raise ForensicsError(f"capture states are {cap.hidden_size} wide; the drafter was built for target hidden size "
                             f"{drafter.spec.target_hidden_size}", path=cap.path)
    if int(cap.input_ids.max()) >= drafter.spec.vocab_size or int(cap.input_ids.min()) < 0:
        raise ForensicsError(f"capture ids fall outside the drafter's vocabulary of {drafter.spec.vocab_size}",
                             path=cap.path)
    rows = min(cap.num_tokens, cap.input_ids.shape[0], max_tokens or cap.num_tokens)
    findings: list[Finding] = []
    trained = None
    if isinstance(train, AlignmentResult):
        result = train
    elif train is not None:
        result = align(train, cap, allow_unsafe=allow_unsafe)
    else:
        result = None
    if result is not None:
        trained, why = trained_positions(result)
        if trained is None:
            findings.append(Finding("trained-wiring-unknown", "warning", why))
    eng_positions, eng_label = None, None
    if engine is not None:
        audit = serving_audit(draft_config, engine, cap.num_layers, engine_version=engine_version, model_type=model_type)
        label = f"{engine}{' ' + engine_version if engine_version else ''} reading {Path(draft_config).name}"
        if any(p is None for p in audit.positions):
            findings.append(Finding("engine-captures-nothing", "warning",
                                    f"{label}: ids {audit.ids_used} include one that captures no state; not replayed"))
        else:
            eng_positions, eng_label = [p for p in audit.positions if p is not None], label
    plan = collect_wirings(cap.num_layers, trained=trained, engine_positions=eng_positions, engine_label=eng_label,
                           given=given)
    y, how, share, more = target_next_tokens(cap, rows, head, device)
    findings += more
    fwd = DraftForward.of(drafter, device)
    ids = to_torch(cap.input_ids[:rows])
    start = time.perf_counter()
    results = []
    for w in plan:
        if len(w.positions) != drafter.spec.num_aux:
            findings.append(Finding("wiring-width", "warning", f"wiring {w.label} has {len(w.positions)} positions; the "
                                    f"drafter's fc reads {drafter.spec.num_aux}: not replayed"))
            continue
        results.append(replay_wiring(fwd, _aux(cap, w.positions), ids, y, steps, label=w.label,
                                     positions=list(w.positions), source="; ".join(w.sources),
                                     note="; ".join(w.notes)))
    seconds = time.perf_counter() - start
    return ReplayReport(str(drafter_dir), drafter.spec.layout, cap.path, cap.num_layers, rows, steps, cost_ratio, how,
                        share, plan, results, findings, seconds, engine_check=engine is not None)
