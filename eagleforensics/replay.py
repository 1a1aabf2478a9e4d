"""The replay pipeline: which wirings to try, running each on a capture, and the result's text/JSON forms.

The wirings come from the rest of the workbench: the positions the training record holds (``align``),
the engines' default ([2, N//2, N-3]), what ``--engine`` reads from the draft config (the drafter's
own config.json unless another is given), and any ``--wiring`` the user names. Each is replayed by
``drafter.replay`` on the capture; the target's next tokens come from its lm_head on the capture's
post-norm final state (read from the target's shards), else from the capture's own ids.
A training record (``--train``) also lends its token ids (when the capture has none) and its loss
mask: then only supervised rows count, as the trainers count acc_k. A record in a trainer's own
layout given as the capture is replayed on its own aux states (the trained wiring) with its own
ids, mask and final state. ``--served-without`` adds the drafter as an engine that ignores some
of its features serves it.
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .arrays import to_torch
from .errors import ForensicsError, printable
from .positions import Position, default_aux_positions
from .io.capture import greedy_key
from .io.served import OWN_EMBEDDING
from .results import Finding

if TYPE_CHECKING:  # pragma: no cover
    from .drafter.replay import WiringReplay
    from .io.capture import Capture
    from .io.drafter import TargetHead
    from .io.training import TrainingRecord
    from .results import AlignmentResult

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
    """Every wiring's replay on one capture, with where the tokens came from, which rows counted, the findings."""

    drafter: str
    layout: str
    capture: str
    num_layers: int | None
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
    counting: str = "every row"  # which rows acc@k / reach@k counted, for people
    loss_mask: str | None = None  # the record whose loss mask limited the counted rows
    supervised_rows: int | None = None  # rows with loss_mask = 1 among the replayed rows
    tokens_from: str = "capture"  # capture | record: where the token ids came from
    record_as_capture: bool = False  # CAPTURE was a training record: its own aux states were replayed
    temperature: float = 0.0
    top_p: float = 1.0
    topk: int = 1
    draft_tokens: int | None = None
    served_without: tuple[str, ...] = ()

    @property
    def wiring_results(self) -> list[WiringReplay]:
        """The wirings proper (the "as served" rows left out)."""
        return [r for r in self.results if not r.served_without]

    @property
    def served(self) -> WiringReplay | None:
        return next((r for r in self.results if r.served_without), None)

    @property
    def trained(self) -> WiringReplay | None:
        return next((r for r in self.wiring_results if "trained" in r.source.split("; ")), None)

    @property
    def best(self) -> WiringReplay | None:
        """The measured wiring with the longest accept length (never one that could not be measured)."""
        return max((r for r in self.wiring_results if r.measured), key=lambda r: r.accept_length or 0.0, default=None)

    @property
    def exit_code(self) -> int:
        """1 when an engine was checked and it would feed something other than the trained wiring, else 0."""
        if not self.engine_check or self.trained is None:
            return 0
        served = [r for r in self.wiring_results
                  if any(s.startswith(("sglang", "vllm", "trtllm")) for s in r.source.split("; "))]
        return 1 if any(r is not self.trained for r in served) else 0

    @property
    def verdict(self) -> str:
        best, trained = self.best, self.trained
        if best is None or best.accept_length is None:
            return "no wiring could be measured (see the findings)"
        text = (f"best wiring {best.label}: accept length {best.accept_length:.2f} for a chain of {self.steps} "
                f"(step-1 acceptance {_pct(best.acc[0])})")
        if trained is not None and trained is not best:
            got = "could not be measured" if trained.accept_length is None else f"gives {trained.accept_length:.2f}"
            text += f"; the trained wiring {trained.label} {got}: check the replay inputs"
        elif trained is not None:
            measured = [r for r in self.wiring_results if r.measured]
            worst = min(measured, key=lambda r: r.accept_length or 0.0)
            if worst is not trained and worst.accept_length is not None:
                text += f"; the worst, {worst.label}, gives {worst.accept_length:.2f}"
        served = self.served
        if served is not None and served.accept_length is not None:
            text += (f"; as served without {', '.join(served.served_without)} ({served.label}): "
                     f"{served.accept_length:.2f}")
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
            "exit_code": self.exit_code, "counting": self.counting, "loss_mask": self.loss_mask,
            "supervised_rows": self.supervised_rows, "tokens_from": self.tokens_from,
            "record_as_capture": self.record_as_capture, "temperature": self.temperature, "top_p": self.top_p,
            "topk": self.topk, "draft_tokens": self.draft_tokens, "served_without": list(self.served_without),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def to_text(self) -> str:
        """The table for people; every text a file or path controls goes through ``errors.printable``."""
        pr = printable
        lines = [f"drafter: {pr(self.drafter)} ({self.layout})",
                 f"capture: {pr(self.capture)} ({'a training record: its own aux states' if self.record_as_capture else f'N={self.num_layers}'}, "
                 f"{self.tokens} tokens{', ids from the record' if self.tokens_from == 'record' else ''})",
                 f"targets: {pr(self.token_source)}",
                 f"counted: {pr(self.counting)}",
                 f"chain:   {self.steps} draft steps per start row; speed-up at draft/verify cost ratio {self.cost_ratio:g}",
                 "", f"VERDICT: {pr(self.verdict)}", ""]
        head = ["wiring", "source", "starts"] + [f"acc@{k}" for k in range(1, self.steps + 1)] + \
            [f"reach@{k}" for k in range(1, self.steps + 1)] + ["accept len", "speed-up"]
        rows = []
        for r in self.results:
            mark = "*" if r is self.trained else ""
            sp = r.speedup(self.cost_ratio)
            rows.append([pr(r.label) + mark, pr(r.source), str(r.starts)] + [_num(a) for a in r.acc] +
                        [_num(a) for a in r.reach] + [_num(r.accept_length), "n/a" if sp is None else f"{sp:.2f}x"])
        lines += _table(head, rows)
        lines.append("(* = the trained wiring; acc@k = step-k draft equals the target token, teacher-forced; "
                     "reach@k = steps 1..k all accepted; accept len = 1 + sum of reach)")
        sampled = [r for r in self.results if r.sampling is not None]
        if sampled:
            lines += ["", f"sampling at temperature {self.temperature:g}"
                      f"{f', top-p {self.top_p:g}' if self.top_p < 1 else ''} (expected, teacher-forced):"]
            head = ["wiring", "greedy drafts: accept@1", "accept len", "sampled drafts: accept@1", "accept len"]
            rows = []
            for r in sampled:
                g, s = r.sampling["greedy_drafts"], r.sampling["sampled_drafts"]  # type: ignore[index]
                rows.append([pr(r.label) + ("*" if r is self.trained else ""), _num(g["accept"][0]),
                             _num(g["accept_length"]), _num(s["accept"][0]), _num(s["accept_length"])])
            lines += ["  " + x for x in _table(head, rows)]
            lines.append("  (greedy drafts verified by sampling, SGLang's default and vLLM's draft_sample_method=greedy: "
                         "step accepted with p_T(draft); sampled drafts, rejection sampling: sum of min(p_T, q_T))")
        trees = [r for r in self.results if r.tree is not None]
        if trees:
            lines += ["", f"SGLang tree: topk {self.topk}, {self.draft_tokens} draft tokens, {self.steps} steps "
                      "(greedy verification):"]
            head = ["wiring", "tree accept len", "chain", "top-k bound"]
            rows = [[pr(r.label) + ("*" if r is self.trained else ""), _num(r.tree["accept_length"]),  # type: ignore[index]
                     _num(r.tree["chain_accept_length"]), _num(r.tree["bound"])] for r in trees]  # type: ignore[index]
            lines += ["  " + x for x in _table(head, rows)]
            lines.append("  (tree: SGLang's node selection simulated with the drafter's own tokens; bound: the target "
                         "token stays in the drafter's top-k along the chain, capped by the draft tokens)")
        if self.findings:
            lines += ["", "findings:"] + [f"  [{f.severity}] {f.code}: {pr(f.message)}" for f in self.findings]
        return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    return out + ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]


def _aux(cap: Capture, positions: tuple[Position, ...]) -> Callable[[int, int], torch.Tensor]:
    """A reader of the wiring's concatenated states, rows a..b-1 (streamed from the file where it allows)."""
    missing = [p.label for p in positions if p not in cap.readers]
    if missing:
        raise ForensicsError(f"capture has no {', '.join(missing)} (it holds {', '.join(p.label for p in cap.positions)})",
                             path=cap.path)
    return lambda a, b: torch.cat([to_torch(cap.read_rows(p, a, b)).float() for p in positions], -1)


@dataclass
class Sequence:
    """What replay reads besides the wiring states: ids, the loss mask, the target's final state and how it was paired."""

    ids: torch.Tensor  # [T] long
    rows: int
    loss_mask: torch.Tensor | None = None  # [T] (1 = supervised)
    mask_source: str | None = None
    tokens_from: str = "capture"
    notes: list[Finding] = field(default_factory=list)
    final: Callable[[int, int], torch.Tensor] | None = None  # a record's post-norm final states (record as capture)


def _final_reader(cap: Capture, head: TargetHead) -> tuple[Callable[[int, int], torch.Tensor], str]:
    """Post-norm final states of the capture (or p=N through the target's final norm) and how they were obtained."""
    from .drafter.replay import rms_norm

    n = cap.num_layers
    post = Position(n, True)  # type: ignore[arg-type]
    if post in cap.readers:
        return (lambda a, b: to_torch(cap.read_rows(post, a, b)).float(),
                f"argmax of the target lm_head ({head.path}) on the capture's post-norm final state")
    if Position(n) in cap.readers and head.norm is not None:  # type: ignore[arg-type]
        if head.norm.shape[0] != cap.hidden_size:
            raise ForensicsError(f"target final norm is {head.norm.shape[0]} wide, the capture's states are "
                                 f"{cap.hidden_size}: not this capture's target", path=head.path)
        norm = head.norm.float()
        return (lambda a, b: rms_norm(to_torch(cap.read_rows(Position(n), a, b)), norm, head.rms_norm_eps),  # type: ignore[arg-type]
                f"argmax of the target lm_head on the capture's p{n} passed through the target's final norm")
    raise ForensicsError(f"capture has neither the post-norm final state nor p{n}: the target's next tokens "
                         "cannot be computed", path=cap.path)


def _greedy_tokens(final: Callable[[int, int], torch.Tensor], rows: int, head: TargetHead, device: str) -> torch.Tensor:
    from .drafter.replay import greedy_rows

    return greedy_rows(final, rows, head.lm_head, device)  # type: ignore[arg-type]


def target_next_tokens(cap: Capture, rows: int, target: Any | None, device: str, ids: torch.Tensor | None = None,
                       mask: torch.Tensor | None = None) -> tuple[torch.Tensor, str, float | None, list[Finding]]:
    """y[t] = the target's greedy token after row t (-1 where unknown); how it was obtained; share of the (counted)
    rows whose next id equals it."""
    ids = to_torch(cap.input_ids[:rows]).long() if ids is None else ids
    findings: list[Finding] = []
    if target is not None and target.lm_head is not None:
        final, how = _final_reader(cap, target)
        if target.lm_head.shape[1] != cap.hidden_size:
            raise ForensicsError(f"target lm_head is {list(target.lm_head.shape)}, the capture's states are "
                                 f"{cap.hidden_size} wide", path=target.path)
        name = getattr(target.lm_head, "name", None)  # a tensor kept in its file (replay's own: always)
        key = greedy_key(target.path, name) if name else None
        held = cap.greedy.get(key) if key else None
        if held is not None and held.shape[0] >= rows:  # an earlier pass of the doctor's (coverage, drafter-baseline)
            y = torch.from_numpy(np.ascontiguousarray(held[:rows], dtype=np.int64))
        else:
            y = _greedy_tokens(final, rows, target, device)
            if key:
                cap.greedy[key] = y.numpy()
        return y, how, *_greedy_share(ids, y, mask, findings)
    y = torch.cat([ids[1:], ids.new_full((1,), -1)])
    findings.append(_assumed_greedy())
    return y, "the capture's own next ids (assumed to be the target's greedy output)", None, findings


def _assumed_greedy() -> Finding:
    return Finding("tokens-assumed-greedy", "warning", (
        "no target lm_head (pass --target DIR): the capture's next ids were taken as the target's tokens, which "
        "holds only when the capture is the target's own greedy output"))


def _greedy_share(ids: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None,
                  findings: list[Finding]) -> tuple[float | None, list[Finding]]:
    """Share of rows (supervised ones, with a mask) whose next id is the target's greedy token."""
    if ids.shape[0] < 2:
        return None, findings
    same = ids[1:] == y[:-1]
    where = y[:-1] >= 0
    if mask is not None:
        where = where & mask[:-1].bool()
    if not bool(where.any()):
        return None, findings
    share = float(same[where].float().mean())
    if share < 0.9:
        findings.append(Finding("ids-not-greedy", "info", (
            f"only {share:.0%} of the {'supervised ' if mask is not None else ''}rows' next ids are the target's own "
            "greedy token (a prompt, or sampled text): steps after the first are teacher-forced with the capture's "
            "ids, as the trainers' acc_k are; a server feeds the drafter its own accepted drafts instead")))
    return share, findings


def _pair_record(cap: Capture, rows: int, rec: TrainingRecord) -> Sequence:
    """Ids, loss mask and row count from the capture and the training record (its trailing padding dropped)."""
    from .evidence.tokens import common_prefix, trailing_padding

    usable = rec.num_tokens - trailing_padding(rec.input_ids, rec.loss_mask)
    rec_ids = None if rec.input_ids is None else torch.as_tensor(np.asarray(rec.input_ids[:usable])).long()
    rec_mask = None if rec.loss_mask is None else torch.as_tensor(np.asarray(rec.loss_mask[:usable])).long()
    notes: list[Finding] = []
    if cap.input_ids is None:
        if rec_ids is None:
            raise ForensicsError("capture holds no input_ids and neither does the training record: the drafter needs "
                                 "the tokens", path=cap.path)
        rows = min(rows, usable)
        seq = Sequence(rec_ids[:rows], rows, None if rec_mask is None else rec_mask[:rows], rec.path, "record")
        notes.append(Finding("tokens-from-record", "info",
                             f"the capture holds no input_ids: the {rows} token ids come from the training record "
                             f"{printable(rec.path)}, paired row by row from the first"))
        seq.notes = notes
        return seq
    ids = to_torch(cap.input_ids[:rows]).long()
    if rec_mask is None:
        return Sequence(ids, rows)
    mask = torch.zeros(rows, dtype=torch.long)
    if rec_ids is None:
        shared = min(rows, usable)
        how = "paired by position (the record has no ids)"
    else:
        shared = common_prefix(rec_ids.numpy(), ids.numpy())
        how = f"the record's ids agree with the capture's on the first {shared} tokens"
        if shared == 0:
            notes.append(Finding("loss-mask-unpaired", "warning",
                                 "the training record's ids differ from the capture's from the first token: its loss "
                                 "mask was not applied, every row counts"))
            seq = Sequence(ids, rows)
            seq.notes = notes
            return seq
    mask[:shared] = rec_mask[:shared]
    if shared < rows:
        notes.append(Finding("loss-mask-partial", "info",
                             f"{how}; capture rows {shared}..{rows - 1} have no loss mask and are not counted"))
    seq = Sequence(ids, rows, mask, rec.path, "capture")
    seq.notes = notes
    return seq


def record_sequence(rec: TrainingRecord, spec: Any, head: TargetHead | None, device: str, max_rows: int | None = None
                    ) -> tuple[Sequence, Callable[[int, int], torch.Tensor], torch.Tensor, str]:
    """A training record given as the capture: its ids and mask, its own aux states, the target tokens from its final
    (its first ``max_rows`` rows only, when given)."""
    from .drafter.replay import rms_norm
    from .evidence.tokens import trailing_padding

    if rec.input_ids is None:
        raise ForensicsError("the training record given as the capture holds no input_ids: the drafter needs the "
                             "tokens", path=rec.path)
    slots = rec.slots(spec.target_hidden_size)
    aux = [s for s in slots if s.role == "aux"]
    final = [s for s in slots if s.role == "final"]
    if len(aux) != spec.num_aux:
        raise ForensicsError(f"the record holds {len(aux)} aux states; the drafter's fc reads {spec.num_aux}",
                             path=rec.path)
    rows = rec.num_tokens - trailing_padding(rec.input_ids, rec.loss_mask)
    rows = rows if max_rows is None else min(rows, max_rows)
    ids = torch.as_tensor(np.asarray(rec.input_ids[:rows])).long()
    mask = None if rec.loss_mask is None else torch.as_tensor(np.asarray(rec.loss_mask[:rows])).long()
    data = [to_torch(s.data) for s in aux]

    def aux_rows(a: int, b: int) -> torch.Tensor:
        return torch.cat([d[a:b].float() for d in data], -1)

    seq = Sequence(ids, rows, mask, rec.path if mask is not None else None, "record")
    if head is None or head.lm_head is None or not final:
        seq.notes.append(_assumed_greedy() if head is None or head.lm_head is None else
                         Finding("tokens-assumed-greedy", "warning", "the record holds no final state: its next ids "
                                 "were taken as the target's tokens"))
        y = torch.cat([ids[1:], ids.new_full((1,), -1)])
        return seq, aux_rows, y, "the record's own next ids (assumed to be the target's greedy output)"
    fin = to_torch(final[0].data)
    if head.lm_head.shape[1] != fin.shape[1]:
        raise ForensicsError(f"target lm_head is {list(head.lm_head.shape)}, the record's final state is "
                             f"{fin.shape[1]} wide", path=head.path)
    if rec.format == "speculators":  # speculators stores the last layer before the final norm
        if head.norm is None or head.norm.shape[0] != fin.shape[1]:
            raise ForensicsError("the record's final state is pre-norm (speculators layout): the target's final norm "
                                 "of the same width is needed", path=head.path)
        norm = head.norm.float()

        def final_rows(a: int, b: int) -> torch.Tensor:
            return rms_norm(fin[a:b], norm, head.rms_norm_eps)
        how = f"argmax of the target lm_head ({head.path}) on the record's last state through the target's final norm"
    else:
        def final_rows(a: int, b: int) -> torch.Tensor:
            return fin[a:b].float()
        how = f"argmax of the target lm_head ({head.path}) on the record's post-norm final state"
    y = _greedy_tokens(final_rows, rows, head, device)
    seq.final = final_rows
    return seq, aux_rows, y, how


def _try_record(path: str | Path, allow_unsafe: bool) -> TrainingRecord | None:
    """The training record at ``path`` when it is one in a trainer's own layout (not a list a capture could be)."""
    from .io.training import load_training

    try:
        rec = load_training(path, allow_unsafe=allow_unsafe)
    except ForensicsError:
        return None
    return rec if rec.format in ("specforge", "speculators", "modelopt", "eagle") else None


def _rope_findings(spec: Any) -> list[Finding]:
    """``rope-scaling-incomplete``: a llama3 rope_scaling without original_max_position_embeddings is replayed with
    the max_position_embeddings transformers 5 and SGLang take for it, and said so (older vLLM fail to load it)."""
    sc = spec.rope_scaling or {}
    if not sc.get("original_assumed"):
        return []
    n = int(sc["original_max_position_embeddings"])
    return [Finding("rope-scaling-incomplete", "warning", (
        f"the draft config's llama3 rope_scaling has no original_max_position_embeddings: replayed with its "
        f"max_position_embeddings ({n}), as transformers 5.24 and SGLang 0.5.23 take it; vLLM 0.10.0 (transformers 4) "
        "fails to load this config (KeyError in get_rope)"),
        fix="Write original_max_position_embeddings (the value the drafter was trained with, usually the target's) "
            "into the draft config's rope_scaling.", source="transformers 5.24 modeling_rope_utils.py; sglang 0.5.23 "
            "srt/layers/rotary_embedding/factory.py; vllm 0.10.0 model_executor/layers/rotary_embedding.py")]


MIN_TEMPERATURE = 0.01  # vLLM's floor for sampling (_MAX_TEMP in vllm/sampling_params.py, 0.33.0, 0.34.0)


def _check_options(steps: int, cost_ratio: float, device: str, temperature: float, top_p: float, topk: int,
                   draft_tokens: int | None, served_without: tuple[str, ...]) -> None:
    from .io.served import SERVED_FEATURES

    if steps < 1 or steps > 16:
        raise ForensicsError(f"--steps must be between 1 and 16, got {steps}")
    if not (cost_ratio >= 0 and cost_ratio < 10):
        raise ForensicsError(f"--cost-ratio must be a number in [0, 10), got {cost_ratio}")
    if device not in ("cpu", "cuda"):
        raise ForensicsError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ForensicsError("--device cuda asked for, but no CUDA device is visible")
    if not (temperature >= 0 and math.isfinite(temperature)) or temperature > 100:
        raise ForensicsError(f"--temperature must be a number in [0, 100], got {temperature}")
    if 0 < temperature < MIN_TEMPERATURE:
        # logits / 1e-45 overflow to inf and the sampled figures turn nan; and no engine samples there: vLLM
        # 0.33.0 and 0.34.0 raise a temperature in (0, 0.01) to 0.01 (vllm/sampling_params.py, _MAX_TEMP), SGLang 0.5.23
        # samples greedily below 1e-6 (sglang/srt/sampling/sampling_params.py, _SAMPLING_EPS)
        raise ForensicsError(f"--temperature {temperature:g} is below {MIN_TEMPERATURE:g}, where engines do not sample "
                             "at the temperature asked (vLLM raises it to 0.01, SGLang decodes greedily below 1e-6): "
                             "pass 0 for greedy decoding or a temperature of at least 0.01")
    if not (0 < top_p <= 1):
        raise ForensicsError(f"--top-p must be in (0, 1], got {top_p}")
    if topk < 1 or topk > 16:
        raise ForensicsError(f"--topk must be between 1 and 16, got {topk}")
    if topk > 1 and draft_tokens is None:
        raise ForensicsError("--topk > 1 needs --draft-tokens (SGLang's --speculative-num-draft-tokens)")
    if draft_tokens is not None and topk == 1:
        raise ForensicsError("--draft-tokens needs --topk > 1 (a chain verifies steps + 1 tokens)")
    unknown = [f for f in served_without if f not in SERVED_FEATURES]
    if unknown:
        raise ForensicsError(f"--served-without {unknown[0]!r} is not a feature replay can drop (known: "
                             f"{', '.join(SERVED_FEATURES)})")


def _counting(seq: Sequence, steps: int) -> str:
    if seq.loss_mask is None:
        return (f"every row: acc@k counts each row with a target token k ahead; reach@k and the accept length "
                f"count start rows with all {steps} target tokens ahead")
    n = int(seq.loss_mask.sum())
    return (f"supervised rows only (loss_mask of {seq.mask_source}: {n} of {seq.rows} rows): acc@k counts row t "
            f"when loss_mask[t+k-1] = 1, as SpecForge's acc_k; reach@k and the accept length count start rows "
            f"with loss_mask[t] = 1")


@dataclass
class _Inputs:
    """Everything replay reads for one run, from a capture sweep or from a record given as the capture."""

    seq: Sequence
    y: torch.Tensor  # the target's greedy token after each row, -1 where unknown
    how: str
    share: float | None
    plan: list[Wiring]
    jobs: list[tuple[Wiring, Callable[[int, int], torch.Tensor], str]]  # (wiring, its states reader, label)
    num_layers: int | None
    path: str
    final: Callable[[int, int], torch.Tensor] | None  # post-norm final states, for the sampling figures
    findings: list[Finding]


def _record_inputs(record: TrainingRecord, spec: Any, head: TargetHead | None, device: str, max_tokens: int | None,
                   temperature: float) -> _Inputs:
    """A training record given as the capture: its own aux states are the one (trained) wiring."""
    seq, aux_rows, y, how = record_sequence(record, spec, head, device)
    rows = min(seq.rows, max_tokens or seq.rows)
    seq.rows = rows
    seq.ids, y = seq.ids[:rows], y[:rows]
    seq.loss_mask = None if seq.loss_mask is None else seq.loss_mask[:rows]
    final = seq.final if temperature > 0 else None
    if temperature > 0 and final is None:
        raise ForensicsError("--temperature needs the target's distribution, but the record holds no final state",
                             path=record.path)
    plan = [Wiring((), ("trained",), ("the record's own aux states",))]
    share, findings = _greedy_share(seq.ids, y, seq.loss_mask, [])
    return _Inputs(seq, y, how, share, plan, [(plan[0], aux_rows, "recorded")],
                   head.num_layers if head is not None else None, record.path, final, findings)


def capture_inputs(cap: Capture, spec: Any, head: TargetHead | None, train: Any, given: list[tuple[Position, ...]],
                    engine: str | None, draft_config: str | Path | None, engine_version: str | None,
                    model_type: str | None, device: str, max_tokens: int | None, temperature: float,
                    allow_unsafe: bool, vllm_runner: str | None = None) -> _Inputs:
    """A capture sweep: the wirings worth trying, ids (the record's when the capture has none) and the loss mask."""
    from .alignment import align
    from .engines.crosscheck import serving_audit, trained_positions
    from .io.training import TrainingRecord, load_training
    from .results import AlignmentResult

    if cap.num_layers is None:
        raise ForensicsError("capture does not say how many layers the target has", path=cap.path)
    if head is not None and head.num_layers is not None and head.num_layers != cap.num_layers:
        raise ForensicsError(f"capture holds the states of a {cap.num_layers}-layer model but the target has "
                             f"{head.num_layers} layers (a training record given as the capture? pass it as "
                             "--train)", path=cap.path)
    if cap.hidden_size != spec.target_hidden_size:
        raise ForensicsError(f"capture states are {cap.hidden_size} wide; the drafter was built for target hidden "
                             f"size {spec.target_hidden_size}", path=cap.path)
    if head is not None and head.norm is not None and head.norm.shape[0] != cap.hidden_size:
        raise ForensicsError(f"target final norm is {head.norm.shape[0]} wide, the capture's states are "
                             f"{cap.hidden_size}: not this capture's target", path=head.path)
    findings: list[Finding] = []
    result, rec = None, None
    if isinstance(train, AlignmentResult):
        result = train
        try:
            rec = load_training(result.train_path, allow_unsafe=allow_unsafe)
        except (ForensicsError, OSError):
            findings.append(Finding("loss-mask-unread", "warning", "the training record could not be read "
                                    "again for its loss mask: every row counts"))
    elif isinstance(train, TrainingRecord):
        rec = train
    elif train is not None:
        rec = load_training(train, allow_unsafe=allow_unsafe)
    if rec is not None and result is None:
        result = align(rec, cap, allow_unsafe=allow_unsafe)
    rows = min(cap.num_tokens, max_tokens or cap.num_tokens)
    if cap.input_ids is not None:
        rows = min(rows, cap.input_ids.shape[0])
    if rec is not None:
        seq = _pair_record(cap, rows, rec)
    elif cap.input_ids is None:
        raise ForensicsError("capture holds no input_ids: the drafter needs the tokens (pass the training record "
                             "with the same tokens as --train)", path=cap.path)
    else:
        seq = Sequence(to_torch(cap.input_ids[:rows]).long(), rows)
    if int(seq.ids.max()) >= spec.vocab_size or int(seq.ids.min()) < 0:
        raise ForensicsError(f"token ids fall outside the drafter's vocabulary of {spec.vocab_size}",
                             path=cap.path if seq.tokens_from == "capture" else seq.mask_source)
    trained = None
    if result is not None:
        trained, why = trained_positions(result)
        if trained is None:
            findings.append(Finding("trained-wiring-unknown", "warning", why))
    eng_positions, eng_label = None, None
    if engine is not None:
        audit = serving_audit(draft_config, engine, cap.num_layers, engine_version=engine_version,
                              model_type=model_type, vllm_runner=vllm_runner)
        label = (f"{engine}{' ' + engine_version if engine_version else ''}"
                 f"{f' ({audit.runner} runner)' if engine == 'vllm' and audit.runner else ''}"
                 f" reading {Path(draft_config).name}")  # type: ignore[arg-type]
        if any(p is None for p in audit.positions):
            findings.append(Finding("engine-captures-nothing", "warning",
                                    f"{label}: ids {audit.ids_used} include one that captures no state; not replayed"))
        else:
            eng_positions, eng_label = [p for p in audit.positions if p is not None], label
    plan = collect_wirings(cap.num_layers, trained=trained, engine_positions=eng_positions, engine_label=eng_label,
                           given=given)
    y, how, share, more = target_next_tokens(cap, seq.rows, head, device, seq.ids, seq.loss_mask)
    jobs = []
    for w in plan:
        if len(w.positions) != spec.num_aux:
            more.append(Finding("wiring-width", "warning", f"wiring {w.label} has {len(w.positions)} positions; the "
                                f"drafter's fc reads {spec.num_aux}: not replayed"))
            continue
        jobs.append((w, _aux(cap, w.positions), w.label))
    final = _final_reader(cap, head)[0] if temperature > 0 and head is not None else None
    return _Inputs(seq, y, how, share, plan, jobs, cap.num_layers, cap.path, final, findings + more)


def run_replay(drafter_dir: str | Path, capture: str | Path | Capture, *, target: str | Path | None = None,
               train: str | Path | AlignmentResult | None = None, wirings: list[str] = (), steps: int = DEFAULT_STEPS,
               cost_ratio: float = DEFAULT_COST_RATIO, engine: str | None = None, draft_config: str | Path | None = None,
               engine_version: str | None = None, model_type: str | None = None, device: str = "cpu",
               max_tokens: int | None = None, convention: str = "hf", allow_unsafe: bool = False,
               temperature: float = 0.0, top_p: float = 1.0, topk: int = 1, draft_tokens: int | None = None,
               served_without: frozenset[str] | tuple[str, ...] = (), vllm_runner: str | None = None
               ) -> ReplayReport:
    """Replay the drafter on every wiring worth trying and score each against the target's next tokens.

    With a training record (``train``, or a record given as ``capture``) that has a loss mask, only supervised
    rows count, as the trainers count acc_k. ``temperature`` (and ``top_p``) add the expected acceptance under
    sampling; ``topk`` > 1 with ``draft_tokens`` adds SGLang's tree; ``served_without`` adds an "as served" row
    with those ``io.served.SERVED_FEATURES`` dropped; ``vllm_runner`` (v1 / v2) picks vLLM's reading of the ids.
    """
    from .engines.crosscheck import check_request
    from .drafter.replay import DraftForward, TargetSide, replay_wiring, start_cuda
    from .io.capture import load_capture
    from .io.drafter import check_finite, load_drafter, load_target, probe_target

    drop = tuple(dict.fromkeys(served_without))
    _check_options(steps, cost_ratio, device, temperature, top_p, topk, draft_tokens, drop)
    start_cuda(device)  # overlaps the reads below
    given = [parse_wiring(w) for w in wirings]
    if engine is not None and draft_config is None:
        draft_config = Path(drafter_dir) / "config.json"  # the drafter's own config is what a server reads
    check_request(draft_config, engine, engine_version, model_type, vllm_runner)
    if target is not None:  # a refused target (its index, a missing shard) is said before the drafter is loaded
        probe_target(target)
    # lazy: the embeddings and the target's lm_head stay in their files (io.diskrows), read as they are used
    on_host = torch.device(device).type == "cpu"  # elsewhere NaN/Inf is looked for once the weights are there
    drafter = load_drafter(drafter_dir, target=target, target_embed=OWN_EMBEDDING in drop, lazy=True,
                           check_finite=on_host)
    spec = drafter.spec
    head = None if target is None else load_target(  # shapes checked from the headers before anything is read
        target, embed=False, expect={"lm_head": (spec.vocab_size, spec.target_hidden_size),
                                     "norm": (spec.target_hidden_size,)}, lazy=True)
    if temperature > 0 and (head is None or head.lm_head is None):
        raise ForensicsError("--temperature needs --target: the target's lm_head gives the distribution p")
    record = None
    if isinstance(capture, (str, Path)):
        try:
            cap = load_capture(capture, convention=convention, allow_unsafe=allow_unsafe)
        except ForensicsError:
            record = _try_record(capture, allow_unsafe)
            if record is None:
                raise
    else:
        cap = capture
    if record is not None:
        if given or engine is not None or train is not None:
            raise ForensicsError("CAPTURE is a training record: replay reads its own aux states as the trained "
                                 "wiring; --wiring, --engine and --train need a capture sweep", path=record.path)
        inp = _record_inputs(record, spec, head, device, max_tokens, temperature)
    else:
        inp = capture_inputs(cap, spec, head, train, given, engine, draft_config, engine_version, model_type, device,
                              max_tokens, temperature, allow_unsafe, vllm_runner)
    seq, rows = inp.seq, inp.seq.rows
    if seq.loss_mask is not None and not bool(seq.loss_mask.bool().any()):
        seq.notes.append(Finding("loss-mask-empty", "warning", (
            f"the loss mask of {printable(seq.mask_source)} marks none of the {rows} replayed rows as supervised (the "
            "capture holds only the prompt?): every row counts, which the trainers' acc_k never do")))
        seq.loss_mask, seq.mask_source = None, None
    findings = seq.notes + inp.findings + _rope_findings(spec)
    bad_targets = int((inp.y[:rows] < 0).sum())
    if bad_targets == rows:
        raise ForensicsError("the final state is NaN or Inf on every row: no target token can be computed",
                             path=inp.path)
    if bad_targets:
        findings.append(Finding("nonfinite-capture", "warning", f"the final state is NaN/Inf on {bad_targets} of "
                                f"{rows} rows: those rows have no target token and are not counted"))
    side = None if inp.final is None or head is None or head.lm_head is None else \
        TargetSide(inp.final, rows, head.lm_head, device)
    fwd = DraftForward.of(drafter, device, consume=True)
    if not on_host:
        check_finite(fwd.w, drafter_dir)
    start = time.perf_counter()
    kwargs: dict[str, Any] = dict(loss_mask=seq.loss_mask, target=side, temperature=temperature, top_p=top_p,
                                  topk=topk, draft_tokens=draft_tokens)
    results = [replay_wiring(fwd, reader, seq.ids, inp.y, steps, label=label, positions=list(w.positions),
                             source="; ".join(w.sources), note="; ".join(w.notes), **kwargs)
               for w, reader, label in inp.jobs]
    if drop and inp.jobs:
        w, reader, label = _served_job(inp.jobs)
        unused = sorted(set(drop) - drafter.features())
        note = f"as an engine serves it when it ignores {', '.join(drop)}" + (
            f" (this drafter does not use {', '.join(unused)}: no change there)" if unused else "")
        results.append(replay_wiring(fwd.without(drop), reader, seq.ids, inp.y, steps, label=label,
                                     positions=list(w.positions), source=f"as served without {', '.join(drop)}",
                                     note=note, served_without=drop, **kwargs))
    findings += _nonfinite_findings(results)
    if results and not any(r.measured for r in results):
        if any(r.excluded_rows for r in results):
            raise ForensicsError("every replayed wiring's aux states are NaN or Inf on the rows that count: nothing to "
                                 "replay", path=inp.path)
        raise ForensicsError(f"no start row has {steps} target tokens after it"
                             + (" and a supervised start" if seq.loss_mask is not None else "")
                             + f" ({rows} rows): use fewer --steps or a longer capture", path=inp.path)
    seconds = time.perf_counter() - start
    return ReplayReport(str(drafter_dir), spec.layout, inp.path, inp.num_layers, rows, steps, cost_ratio, inp.how,
                        inp.share, inp.plan, results, findings, seconds, engine_check=engine is not None,
                        counting=_counting(seq, steps), loss_mask=seq.mask_source if seq.loss_mask is not None else None,
                        supervised_rows=None if seq.loss_mask is None else int(seq.loss_mask.sum()),
                        tokens_from=seq.tokens_from, record_as_capture=record is not None, temperature=temperature,
                        top_p=top_p, topk=topk, draft_tokens=draft_tokens, served_without=drop)


def _served_job(jobs: list[tuple[Wiring, Any, str]]) -> tuple[Wiring, Any, str]:
    """The wiring the engine feeds (else the trained one, else the first replayed) for the "as served" row."""
    for want in (("sglang", "vllm", "trtllm"), ("trained",)):
        for job in jobs:
            if any(s.startswith(want) for s in job[0].sources):
                return job
    return jobs[0]


def _nonfinite_findings(results: list[WiringReplay]) -> list[Finding]:
    bad = [r for r in results if r.excluded_rows]
    if not bad:
        return []
    return [Finding("nonfinite-capture", "warning", "NaN/Inf aux states (those rows are masked out of attention and "
                    "not counted): " + "; ".join(f"{r.label}: {r.excluded_rows} rows"
                                                 + ("" if r.measured else ", nothing left to measure")
                                                 for r in bad))]
