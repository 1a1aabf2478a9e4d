"""The lines an engine prints when it refuses to start or dies: what the launch check quotes as a finding.

Each marker is the text of a logging call or raise in the released wheels (read, not copied):

* vLLM ``v1/engine/core.py`` ``logger.exception("EngineCore failed to start.")`` /
  ``"EngineCore encountered a fatal error."`` (0.10.0 - 0.34.0), ``v1/engine/utils.py`` ``RuntimeError("Engine
  core initialization failed. See root cause above. ...")`` (0.10.0 - 0.34.0), and the EAGLE-3 refusal
  ``"Model does not support EAGLE3 interface ..."`` (``v1/worker/gpu_model_runner.py`` 0.10.1.1 - 0.33.0;
  ``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`` 0.25.0 - 0.34.0). Lines of the engine-core process are prefixed
  ``(EngineCore_DP0 pid=N)``, the API server's ``(APIServer pid=N)`` (0.11 on).
* SGLang ``managers/scheduler.py`` ``logger.error(f"Scheduler hit an exception: {traceback}")`` (0.4.10 -
  0.5.23) and ``entrypoints/engine.py`` ``"Received sigquit from a child process. It usually means the child
  failed."``, ``"Initialization failed. Please see the error messages above."``.
* Python: a traceback whose last line is ``SomeError: message`` (the error that ended the process); an
  ``AttributeError`` naming ``set_aux_hidden_state_layers`` (vLLM 0.9.2 - 0.10.0, no interface test) or
  ``set_eagle3_layers_to_capture`` (SGLang) is the EAGLE-3 refusal of a model class without the capture.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .loglines import read_lines

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# the process prefix vLLM puts on every line of a child process (vllm/utils ``_add_prefix``: "(EngineCore_DP0
# pid=N) "), then vLLM's header (logger.py ``_FORMAT``, repeated on every line of a multi-line message by
# logging_utils/formatter.py) or SGLang's (utils/common.py ``configure_logger``: "[2026-11-29 12:00:01 TP0] ")
_PREFIX = re.compile(r"^\([\w.-]+ pid=\d+\)\s*")
_HEADER = re.compile(r"^(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?"
                     r"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?[^\]]*\] ?)")
ENGINE_LINES = (
    ("Model does not support EAGLE3 interface", "eagle3-refused",
     "vllm 0.10.1.1 - 0.33.0 vllm/v1/worker/gpu_model_runner.py; vllm 0.25.0 - 0.34.0 "
     "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"),
    ("has no attribute 'set_aux_hidden_state_layers'", "eagle3-refused",
     "vllm 0.9.2, 0.10.0 vllm/v1/worker/gpu_model_runner.py (calls set_aux_hidden_state_layers untested)"),
    ("has no attribute 'set_eagle3_layers_to_capture'", "eagle3-refused",
     "sglang 0.4.10 - 0.5.8 srt/model_executor/model_runner.py; sglang 0.5.23 model_runner_components/"
     "attention_backend_setup.py (call set_eagle3_layers_to_capture when EAGLE-3 is asked for)"),
    ("EngineCore failed to start", "start-failed", "vllm 0.10.0 - 0.34.0 vllm/v1/engine/core.py"),
    ("Engine core initialization failed", "start-failed", "vllm 0.10.0 - 0.34.0 vllm/v1/engine/utils.py"),
    ("EngineCore encountered a fatal error", "died", "vllm 0.10.0 - 0.34.0 vllm/v1/engine/core.py"),
    ("Scheduler hit an exception", "died", "sglang 0.4.10 - 0.5.23 srt/managers/scheduler.py"),
    ("Received sigquit from a child process", "died", "sglang 0.5.8 - 0.5.23 srt/entrypoints/engine.py"),
    ("Initialization failed. Please see the error messages above", "start-failed",
     "sglang 0.5.8 - 0.5.23 srt/entrypoints/engine.py"),
)
READY = ("The server is fired up and ready to roll", "Application startup complete", "Decode batch")
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?::\s*(.*))?$")


@dataclass(frozen=True)
class Failure:
    """The engine's refusal or death after the last start: the marker line, the error that ended it, the kind."""

    kind: str  # eagle3-refused | start-failed | died | traceback
    line_no: int
    line: str
    error: str | None  # the last ``SomeError: message`` line of the traceback, when there is one
    error_line_no: int | None
    source: str
    started: bool  # a ready line came before the failure


def _strip(text: str) -> str:
    return _HEADER.sub("", _PREFIX.sub("", _ANSI.sub("", text.rstrip("\r\n")))).strip()


def find_failure(lines: Iterable[tuple[int, str]], after: int = 0) -> Failure | None:
    """The engine's start refusal or death in the log lines after line ``after`` (the last arguments line), None
    when there is none or the server came up after it."""
    marker: tuple[int, str, str, str] | None = None
    error: tuple[int, str] | None = None
    in_tb = False
    ready_before = False
    for no, raw in lines:
        if no <= after:
            continue
        text = _strip(raw)
        if not text:
            continue
        if any(r in text for r in READY):
            if marker is None and error is None:
                ready_before = True
            elif marker is not None or error is not None:
                # the server came up (again) after what looked like a failure: a logged, survived exception
                marker, error, ready_before = None, None, True
            continue
        for needle, kind, src in ENGINE_LINES:
            if needle in text:
                rank = ("eagle3-refused", "start-failed", "died")
                if marker is None or rank.index(kind) < rank.index(marker[2]):
                    marker = (no, text, kind, src)
        if "Traceback (most recent call last)" in text:
            in_tb = True
            continue
        m = _ERROR_LINE.match(text)
        if m and (in_tb or _ANSI.sub("", raw).lstrip().startswith(m.group(1))):
            error = (no, text)
            in_tb = False
    if marker is None and error is None:
        return None
    if marker is None:
        assert error is not None
        if "set_aux_hidden_state_layers" in error[1] or "set_eagle3_layers_to_capture" in error[1]:
            return Failure("eagle3-refused", error[0], error[1], error[1], error[0], ENGINE_LINES[1][2] if
                           "set_aux" in error[1] else ENGINE_LINES[2][2], ready_before)
        if ready_before:
            return None  # a request's error logged by a running server, not the end of the engine
        return Failure("traceback", error[0], error[1], error[1], error[0], "the Python traceback ending the log",
                       ready_before)
    no, text, kind, src = marker
    return Failure(kind, no, text, error[1] if error else None, error[0] if error else None, src, ready_before)


def log_failure(path: str | Path, after: int = 0) -> Failure | None:
    """``find_failure`` over a log file."""
    return find_failure(read_lines(path), after)
