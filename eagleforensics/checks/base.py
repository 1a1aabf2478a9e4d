"""What a doctor check is, what it returns, and the user's artifacts it reads (each loaded once, on first use).

A check names the inputs it needs (``needs``: each an input name, or ``a|b`` for either), the
finding codes it may emit, and a function from ``Artifacts`` to a ``CheckResult``. The doctor
runs every check whose inputs are there and lists the others with the option that would enable
them. Loading is lazy and shared: ten checks that read the drafter's config parse it once.

A check that refuses its own work (a rules table that does not reach the version, a value past what the engines
accept) is "not run" with the reason; a bad input file is one line, exit 2, for the whole run (``is_refusal``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import ForensicsError
from ..io.modeldir import ModelDir, check_weight_kinds, read_config
from ..results import Finding
from .drafterfacts import target_facts

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..engines.serverargs import ServerArgs
    from ..io.capture import Capture
    from ..io.training import TrainingRecord

# input name -> the option that provides it and what it is, for the "not run: needs ..." lines
INPUTS: dict[str, str] = {
    "drafter": "--drafter DIR (the drafter's config.json and safetensors)",
    "target": "--target DIR (the target's config.json and safetensors shards)",
    "train": "--train RECORD_OR_DIR (training records)",
    "capture": "--capture FILE (hidden states captured from the served target)",
    "draft_config": "--draft-config CFG or --drafter DIR (the draft config the engine reads)",
    "engine": "--engine E (or --log SERVER_LOG, whose arguments line names it)",
    "log": "--log SERVER_LOG (the server's log, with its arguments line)",
    "served_len": "--served-len N (or --log SERVER_LOG with the served context length)",
    "served_prompts": "--served-prompts FILE (a JSONL of served requests: messages, prompt text or token ids)",
}
FOUND, CLEAN, NOT_RUN = "found", "clean", "not-run"
FLAGGED = ("error", "warning")  # severities that make a check "found"; info findings are context
DEFAULT_MAX_RECORDS = 64
SWEEP_ENTRIES = 6  # hidden-state entries from which a file without a loss mask is a capture sweep, not a record


@dataclass(frozen=True)
class DoctorInputs:
    """Everything the user handed the doctor; None = not given."""

    drafter: str | None = None
    target: str | None = None
    train: str | None = None
    capture: str | None = None
    draft_config: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    vllm_runner: str | None = None
    model_type: str | None = None
    log: str | None = None
    served_len: int | None = None
    served_prompts: str | None = None
    capture_convention: str = "hf"
    max_records: int = DEFAULT_MAX_RECORDS
    allow_unsafe: bool = False
    skip: tuple[str, ...] = ()  # check names left out (--skip); their rows say "skipped"
    only: tuple[str, ...] = ()  # when given, the only checks run (--only)
    device: str = "cpu"  # where replay and the lm_head products run (--device cuda)

    def given(self) -> dict[str, Any]:
        """The inputs that were given, for the JSON (skip / only / device only when set)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()
                if v is not None and v != () and not (k == "device" and v == "cpu") and k not in (
                    "capture_convention", "max_records", "allow_unsafe")}


@dataclass(frozen=True)
class CheckResult:
    """What a check found: findings (codes from the check's ``codes``), a note on what was checked, numbers."""

    findings: tuple[Finding, ...] = ()
    note: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""  # the inputs were there but unusable for this check (a target without tokenizer): not run


@dataclass(frozen=True)
class Check:
    """One cause of low acceptance: which inputs it needs, which codes it may emit, how to look for it."""

    name: str
    title: str
    codes: tuple[str, ...]
    needs: tuple[str, ...]
    run: Callable[[Artifacts], CheckResult]
    order: int = 100  # where it sits among clean and not-run rows (found rows sort by severity and impact)


@dataclass(frozen=True)
class CheckOutcome:
    """One row of the doctor's table: a check found something, was clean, or was not run (and why)."""

    name: str
    title: str
    status: str
    findings: tuple[Finding, ...] = ()
    note: str = ""
    reason: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "status": self.status,
                "codes": sorted({f.code for f in self.findings}), "note": self.note, "reason": self.reason,
                "data": self.data}


def is_refusal(exc: ForensicsError) -> bool:
    """Whether ``exc``, raised inside one check, is that check's own refusal (a rule lookup, a bound), not bad input.

    Bad input names its file (``exc.path``) or was raised while an input was read (``Artifacts``' readers mark
    it): the whole run stops there, exit 2, as where the file is first read. Anything else concerns the check
    that asked (a version older than its rules table), so only that check is "not run".
    """
    return exc.path is None and not getattr(exc, "about_input", False)


def _input(read: Callable[[Any], Any]) -> cached_property:
    """An ``Artifacts`` reader, read once; an error while reading marks itself as about the input (``is_refusal``)."""
    @wraps(read)
    def marked(self: Any) -> Any:
        try:
            return read(self)
        except ForensicsError as exc:
            exc.about_input = True  # type: ignore[attr-defined]
            raise
    return cached_property(marked)


class Artifacts:
    """The user's artifacts behind ``DoctorInputs``, each read once on first use (bad input raises one line)."""

    def __init__(self, inputs: DoctorInputs) -> None:
        self.inputs = inputs
        self._memo: dict[str, Any] = {}

    def memo(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()`` computed once per doctor run and shared between checks (a map diagnosis, next tokens)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def memoised(self, key: str) -> Any:
        """What ``memo(key, ...)`` computed earlier in this run, or None."""
        return self._memo.get(key)

    def aligned(self) -> Any:
        """align's result on the first training record against the capture (with the engine's cross-check when an
        engine is known), computed once: the wiring row judges it, drafter-baseline and replay read its wiring."""
        from ..alignment import align

        i, engine = self.inputs, self.engine
        draft = (i.draft_config or i.drafter) if engine is not None else None
        return self.memo("aligned", lambda: align(
            self.capture_record_path(), self.capture, engine=engine, draft_config=draft,
            engine_version=self.engine_version if engine else None, model_type=self.model_type if engine else None,
            vllm_runner=self.vllm_runner if engine == "vllm" else None, allow_unsafe=i.allow_unsafe,
            final_norm=self.final_norm()))

    def final_norm(self) -> Any:
        """The target's final norm weight (align decides the capture's final kind by it), or None without
        ``--target``, without such a tensor, or with its shard not downloaded."""
        if not self.available("target"):
            return None
        name = self.target.find("norm")
        if name is None:
            return None
        try:
            return self.target.read(name)
        except ForensicsError:  # MissingShard included: then the gain is fitted from the rows, or not used
            return None

    def capture_record_path(self) -> str:
        """The record of the captured sequence: with --train DIR, the one whose token ids hold the capture's
        (``evidence.recordmatch``), else the first record (one file given, or no ids to compare). When none holds
        them, the record sharing the longest opening with the capture, and ``capture_record_note`` says so."""
        paths = self.record_paths
        if len(paths) < 2 or self.capture.input_ids is None or all(r.input_ids is None for r in self.records):
            return paths[0]
        from ..evidence.recordmatch import closest_record, match_record

        m = self.memo("capture-record", lambda: match_record(self.capture.input_ids, self.records))
        if m is not None:
            return paths[m.index]
        c = closest_record(self.capture.input_ids, self.records)
        self._memo["capture-record-note"] = (
            f"no training record of the {len(paths)} read under --train holds the capture's "
            f"{self.capture.input_ids.shape[0]} token ids (another sequence was captured?): aligned against "
            f"{Path(paths[c.index]).name}, which shares only its first {c.shared}; capture a record's own ids "
            "(capture --input-ids RECORD, or --prompts with its ids) to compare the same sequence")
        return paths[c.index]

    # ------------------------------------------------------------------ which inputs are there
    def available(self, name: str) -> bool:
        """True when input ``name`` was given or can be derived from what was given."""
        i = self.inputs
        if name == "draft_config":
            return i.draft_config is not None or i.drafter is not None
        if name == "engine":
            return self.engine is not None
        if name == "served_len":
            return self.served_len is not None
        if name not in INPUTS:
            raise KeyError(name)
        return getattr(i, name) is not None

    def missing(self, needs: tuple[str, ...]) -> list[str]:
        """The needs not met; ``a|b`` is met by either."""
        return [need for need in needs if not any(self.available(alt) for alt in need.split("|"))]

    # ------------------------------------------------------------------ the artifacts
    @_input
    def drafter(self) -> ModelDir:
        if self.inputs.drafter is None:
            raise ForensicsError("no --drafter given")
        md = ModelDir(self.inputs.drafter, "drafter directory")
        check_weight_kinds(md)  # an integer fc / norm / lm_head is one line, as replay says it
        return md

    @_input
    def target(self) -> ModelDir:
        if self.inputs.target is None:
            raise ForensicsError("no --target given")
        return ModelDir(self.inputs.target, "target directory")

    @_input
    def draft_config(self) -> dict[str, Any]:
        """The draft config an engine reads: ``--draft-config`` when given, else the drafter's config.json."""
        if self.inputs.draft_config is not None:
            return read_config(self.inputs.draft_config, "draft config")
        return self.drafter.config

    @_input
    def record_paths(self) -> list[str]:
        """The training record files: ``--train`` itself, or up to ``max_records`` found under the directory."""
        train = self.inputs.train
        if train is None:
            raise ForensicsError("no --train given")
        p = Path(train)
        if not p.is_dir():
            return [train]
        from ..scan.runner import find_records

        from ..io.training import load_training

        skipped: list[str] = []
        found = find_records(p, skipped)
        loaded: dict[str, TrainingRecord] = self._memo.setdefault("records-loaded", {})
        keep = []
        for rel in found:
            if len(keep) >= self.inputs.max_records:
                break
            rec = loaded[str(p / rel)] = load_training(str(p / rel), allow_unsafe=self.inputs.allow_unsafe)
            if len(rec.entries) >= SWEEP_ENTRIES and rec.loss_mask is None:  # a capture sweep kept beside the data
                del loaded[str(p / rel)]
                skipped.append(rel)
                continue
            keep.append(str(p / rel))
        self._memo["train-skipped"] = skipped  # model directories and captures inside --train: said in the inputs row
        return keep

    @_input
    def records(self) -> list[TrainingRecord]:
        from ..io.training import load_training

        loaded = self._memo.get("records-loaded", {})
        return [loaded.get(path) or load_training(path, allow_unsafe=self.inputs.allow_unsafe)
                for path in self.record_paths]

    @_input
    def capture(self) -> Capture:
        from ..io.capture import load_capture

        if self.inputs.capture is None:
            raise ForensicsError("no --capture given")
        return load_capture(self.capture_path, convention=self.inputs.capture_convention,
                            allow_unsafe=self.inputs.allow_unsafe)

    @cached_property
    def capture_path(self) -> str:
        """--capture, or for a capture set (``capture --prompts``) the capture the single-sequence checks read: the
        first whose ids a training record holds (else the first); replay pools every capture of the set."""
        from ..io.captureset import list_capture_set

        files = list_capture_set(self.inputs.capture) if self.inputs.capture is not None else None
        if files is None:
            return str(self.inputs.capture)
        self._memo["capture-set"] = files
        if self.inputs.train is not None:
            from ..evidence.recordmatch import match_record
            from ..io.capture import load_capture

            records = self.records
            for f in files:
                ids = load_capture(f, allow_unsafe=self.inputs.allow_unsafe).input_ids
                if ids is not None and match_record(ids, records) is not None:
                    return str(f)
        return str(files[0])

    # ------------------------------------------------------------------ the server log
    @_input
    def server_log(self) -> pd.DataFrame:
        """The log's data lines (``engines.logs.parse_log``); ``attrs["server_args"]`` is its arguments line."""
        from ..engines.logs import parse_log

        if self.inputs.log is None:
            raise ForensicsError("no --log given")
        return parse_log(self.inputs.log)

    @property
    def server_args(self) -> ServerArgs | None:
        """The last server start's arguments line (``engines.serverargs``), None without a log or such a line."""
        if self.inputs.log is None:
            return None
        return self.server_log.attrs.get("server_args")

    @_input
    def served_prompts(self) -> list[Any]:
        """The served requests of ``--served-prompts`` (``io.servedprompts.ServedPrompt``)."""
        from ..io.servedprompts import load_served_prompts

        if self.inputs.served_prompts is None:
            raise ForensicsError("no --served-prompts given")
        return load_served_prompts(self.inputs.served_prompts)

    @_input
    def audit(self) -> Any:
        """The training-data audit's view of the target (``scan.audit.TargetAudit``): head and template skeleton."""
        from ..scan.audit import TargetAudit

        if self.inputs.target is None:
            raise ForensicsError("no --target given")
        audit = TargetAudit.load(self.inputs.target)
        if audit.head is not None and self.inputs.device != "cpu":  # its lm_head products on the GPU
            audit.scorer.device = self.inputs.device
        return audit

    @cached_property
    def audit_lines(self) -> list[dict[str, Any]]:
        """One audit line per training record (shape, template reading, target agreement), computed once."""
        from ..scan.audit import audit_records

        return audit_records(list(zip(self.record_paths, self.records)), self.audit)

    @property
    def engine(self) -> str | None:
        """--engine, else the engine whose arguments line the log holds."""
        if self.inputs.engine is not None:
            return self.inputs.engine
        args = self.server_args
        return args.engine if args is not None else None

    @property
    def engine_version(self) -> str | None:
        """--engine-version, else the log's exact version (vLLM prints it), else the newest release whose
        arguments line looks like the log's (``ServerArgs.version_range``), else None (the newest known)."""
        if self.inputs.engine_version is not None:
            return self.inputs.engine_version
        args = self.server_args
        if args is None or (self.inputs.engine is not None and args.engine != self.inputs.engine):
            return None
        if args.version:
            return args.version
        if args.version_range is not None and args.version_range[1] is not None:
            return args.version_range[1]
        return None

    @property
    def engine_version_from(self) -> str:
        """Where ``engine_version`` came from, in words (empty when given on the command line or unknown)."""
        if self.inputs.engine_version is not None or self.engine_version is None:
            return ""
        args = self.server_args
        if args is not None and args.version:
            return "the log"
        return f"the log's arguments format ({args.version_hint})" if args is not None and args.version_hint \
            else "the log's arguments format"

    @property
    def vllm_runner(self) -> str | None:
        """--vllm-runner, else the runner the log or the release decides for this launch (``vllm_runner_from``)."""
        if self.inputs.vllm_runner is not None:
            return self.inputs.vllm_runner
        return self._launch_runner[0]

    @property
    def vllm_runner_from(self) -> str:
        """Why ``vllm_runner`` is what it is when it was not given (the log's fallback line, the release's rule)."""
        return "" if self.inputs.vllm_runner is not None else self._launch_runner[1]

    @cached_property
    def _launch_runner(self) -> tuple[str | None, str]:
        from ..engines.launchrules import V1_FALLBACK_LINE, launch_runner
        from ..engines.loglines import read_lines

        args = self.server_args
        if args is None or self.engine != "vllm" or args.engine != "vllm":
            return None, ""
        lines = [line for _, line in read_lines(self.inputs.log) if V1_FALLBACK_LINE in line][:1]
        return launch_runner(self.engine_version, args.algorithm, args.pp, lines)

    @property
    def model_type(self) -> str | None:
        """--model-type, else the target's model_type (the engine rules depend on it)."""
        if self.inputs.model_type:
            return self.inputs.model_type
        if self.available("target"):
            return target_facts(self.target.config).model_type
        return None

    @property
    def served_len(self) -> int | None:
        """--served-len, else the context length the log's arguments line states."""
        if self.inputs.served_len is not None:
            return self.inputs.served_len
        args = self.server_args
        return args.max_len if args is not None and args.max_len else None
