"""Find and read the server's launch-arguments line in an SGLang or vLLM log, apart from its metrics lines.

``doctor`` checks the launch (algorithm, draft path, pipeline parallelism) and ``plan`` reads each
run's steps/topk/draft tokens from this line; ``logs`` uses it to tell a server that has not
logged statistics yet from a file that is no server log. The metrics parser (``engines.logs``)
asks ``is_args_line`` first, so an arguments line is never read as metrics, and the markers below
must follow the logging prefix (``"] "``) or start the line, so a metrics line is never read as
arguments. Values are read by ``engines.pyrepr`` (a bounded tokenizer, never ``eval``).

Formats, as printed by each release (wheels unpacked with ``pip download --no-deps``; every release
in each range was read unless the range says which were):

======================  ==========================================================================
SGLang 0.4.0            ``server_args=ServerArgs(model_path='...', tp_size=1, ...)`` (dataclass
                        repr, every field): python/sglang/srt/server.py ``launch_server``,
                        ``logger.info(f"{server_args=}")``. No speculative fields yet.
SGLang 0.4.3 - 0.5.18   the same repr from python/sglang/srt/entrypoints/engine.py
                        (``_launch_subprocesses`` and ``Engine.__init__``; read 0.4.3, 0.4.6 - 0.4.8,
                        0.4.10, 0.4.10.post2 and every 0.5.x release to 0.5.18, some .postN too;
                        0.4.1, 0.4.2, 0.4.4, 0.4.5, 0.4.9 not read). Fields: ``speculative_algorithm``,
                        ``speculative_draft_model_path``, ``speculative_num_steps``,
                        ``speculative_eagle_topk``, ``speculative_num_draft_tokens`` (0.4.3 on),
                        ``pp_size`` (0.4.7 on), ``tp_size``, ``dp_size``, ``context_length``,
                        ``decode_log_interval``, ``disable_cuda_graph``, ``disable_radix_cache``.
                        Printed after ``__post_init__``: ``NEXTN`` already reads ``EAGLE`` and
                        MTP targets already carry the target path as draft path.
SGLang 0.5.19 - 0.5.21  ``server_args={'model_path': '...', ...}`` (dict repr of
                        ``ServerArgs.resolved_dict()``, same flat field names): engine.py.
SGLang 0.5.22 - 0.5.23  the same dict through ``_server_args_for_logging`` (watermark keys
                        redacted): engine.py.
vLLM 0.10.0             ``non-default args: {'model_tag': '...', 'speculative_config': {...}}``
                        (dict repr of the arguments unlike the parser's defaults):
                        vllm/entrypoints/openai/cli_args.py ``log_non_default_args``.
vLLM 0.10.1.1 - 0.22.1  the same line from vllm/entrypoints/utils.py (also for ``LLM(...)``).
vLLM 0.23.0 - 0.28.0    vllm/entrypoints/serve/utils/api_utils.py.
vLLM 0.29.0 - 0.32.0    api_utils.py, sensitive values printed as ``'***'``.
vLLM 0.33.0 - 0.34.0    vllm/entrypoints/common/startup.py (``redact_sensitive_args``; the file
                        is the same in both).
vLLM, every release     ``args: Namespace(...)`` (every argument, ``<function ...>`` values included)
                        from run_batch (entrypoints/cli/run_batch.py, openai/run_batch.py) and,
                        0.10.0 - 0.24.0, the demo server vllm/entrypoints/api_server.py.
vLLM, every release     ``Initializing a V1 LLM engine (v0.10.0) with config: model='...',
                        speculative_config=SpeculativeConfig(method='eagle3', model='...',
                        num_spec_tokens=3), ..., max_seq_len=..., tensor_parallel_size=...,
                        pipeline_parallel_size=..., enforce_eager=..., enable_prefix_caching=...``
                        (``VllmConfig.__str__``, vllm/config.py 0.10.x, vllm/config/vllm.py later;
                        the line the engine core prints, from vllm/v1/engine/core.py): the resolved
                        values and the exact version.
vLLM 0.10.0 - 0.24.0    ``vLLM API server version X`` before the arguments; 0.15.0 on
                        ``vLLM server version X, serving model M`` (or a logo with ``version X``
                        when colour is on), from 0.25.0 only those.
======================  ==========================================================================

vLLM fields: ``speculative_config`` (a dict: ``--speculative-config`` is parsed with
``json.loads``; keys ``method``, ``model``, ``num_speculative_tokens``, ``-`` spellings folded to
``_`` as vLLM 0.33.0 and 0.34.0 do, engine/arg_utils.py), ``spec_method`` / ``spec_model`` / ``spec_tokens`` (flags from 0.22.0),
``model_tag``/``model``, ``tensor_parallel_size``, ``pipeline_parallel_size``,
``data_parallel_size``, ``max_model_len``, ``enforce_eager``, ``enable_prefix_caching``,
``disable_log_stats``. A non-default-args line omits defaults; ``ServerArgs.inferred`` names the
fields filled from the engine's default (tp/pp/dp 1, enforce_eager False: vllm/config/parallel.py,
model.py 0.33.0, 0.34.0; vllm/config.py 0.10.0) or the engine config line.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import ForensicsError, printable
from ..io.bounds import LAUNCH_INTS, past_bound
from .loglines import read_lines
from .pyrepr import ARGS_KEY, CALL_KEY, ReprError, parse_repr, split_assignments

ENGINES = ("sglang", "vllm")
# No arguments line is this long (SGLang's full dump is tens of KiB); past it, it is not one.
MAX_ARGS_LINE = 1024 * 1024

# (engine, first release, last release read, source id, where): the table in the docstring, as data.
FORMATS: tuple[tuple[str, str, str | None, str, str], ...] = (
    ("sglang", "0.4.0", "0.5.18", "sglang-repr",
     "server_args=ServerArgs(...): python/sglang/srt/server.py 0.4.0, entrypoints/engine.py 0.4.3 - 0.5.18"),
    ("sglang", "0.5.19", None, "sglang-dict",
     "server_args={...}: python/sglang/srt/entrypoints/engine.py resolved_dict() 0.5.19 - 0.5.23"),
    ("vllm", "0.10.0", None, "vllm-non-default",
     "non-default args: {...}: vllm/entrypoints/openai/cli_args.py 0.10.0, entrypoints/utils.py "
     "0.10.1.1 - 0.22.1, serve/utils/api_utils.py 0.23.0 - 0.32.0, common/startup.py 0.33.0, 0.34.0"),
    ("vllm", "0.10.0", None, "vllm-namespace",
     "args: Namespace(...): vllm/entrypoints/cli/run_batch.py 0.10.0 - 0.34.0, api_server.py 0.10.0 - 0.24.0"),
    ("vllm", "0.10.0", None, "vllm-engine-config",
     "Initializing a V1 LLM engine (vX) with config: ...: vllm/v1/engine/core.py, VllmConfig.__str__"),
)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LEAD = r"(?:^\s*|\] )"
_SGL_ARGS = re.compile(_LEAD + r"server_args=(?=ServerArgs\(|\{)")
_VLLM_NON_DEFAULT = re.compile(_LEAD + r"non-default args: (?=\{)")
_VLLM_NAMESPACE = re.compile(_LEAD + r"args: (?=Namespace\()")
_VLLM_CONFIG = re.compile(_LEAD + r"Initializing a V[01] LLM engine \(v([0-9][\w.+-]{0,40})\) with config: ")
_VLLM_VERSION = re.compile(_LEAD + r"vLLM (?:API )?server version ([0-9][\w.+-]{0,40})")
_VLLM_LOGO = re.compile(r"\u2588\s+version\s+([0-9][\w.+-]{0,40})\s*$")
# (kind, a substring every such line holds, the anchored pattern)
_PROBES = (
    ("sglang", "server_args=", _SGL_ARGS),
    ("vllm-non-default", "non-default args: ", _VLLM_NON_DEFAULT),
    ("vllm-namespace", "args: Namespace(", _VLLM_NAMESPACE),
    ("vllm-engine-config", " LLM engine (v", _VLLM_CONFIG),
    ("vllm-version", " server version ", _VLLM_VERSION),
    ("vllm-logo", "version", _VLLM_LOGO),
)
# ``<SpeculativeAlgorithm.EAGLE3: 3>``: the dotted name and its colon; the rest is checked by hand. One greedy run
# (no lazy prefix before it), so a '<' and 120k letters is read in one pass, not retried at every split.
_ENUM_HEAD = re.compile(r"<\s*([\w.]+)\s*:")
_SGLANG_REPR_UNTIL = "0.5.18"
_SGLANG_DICT_SINCE = "0.5.19"

# SGLang ServerArgs field -> record field; vLLM arg -> record field.
_SGLANG_FIELDS = {
    "model": "model_path", "draft": "speculative_draft_model_path",
    "num_steps": "speculative_num_steps", "topk": "speculative_eagle_topk",
    "num_draft_tokens": "speculative_num_draft_tokens", "tp": "tp_size", "pp": "pp_size",
    "dp": "dp_size", "max_len": "context_length", "decode_log_interval": "decode_log_interval",
}


def normalise_algorithm(raw: object) -> str | None:
    """One spelling per algorithm: 'EAGLE3'/'eagle3' -> 'eagle3'; every ``*_mtp`` and 'mtp' -> 'mtp'.

    SGLang names (EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, DFLASH, DSPARK, FROZEN_KV_MTP, UNO) and
    vLLM methods (eagle, eagle3, ngram, '[ngram]', medusa, mlp_speculator, draft_model, deepseek_mtp
    and the other ``*_mtp``, mtp, suffix, dflash, dspark, ...) are lower-cased; an enum repr
    ``<SpeculativeAlgorithm.EAGLE3: 3>`` gives its member name. None / 'None' / '' -> None.
    """
    if raw is None:
        return None
    text = str(raw).strip()
    member = _enum_member(text)
    if member:
        text = member
    text = text.strip("'\" ").lower()
    if text in ("", "none", "null"):
        return None
    if text == "[ngram]":
        return "ngram"
    if text == "mtp" or text.endswith("_mtp"):
        return "mtp"
    return text


def _enum_member(text: str) -> str | None:
    """The member name of an enum repr ``<Class.MEMBER: value>`` (the last dotted part), else None."""
    m = _ENUM_HEAD.match(text)
    if not m or not text.rstrip().endswith(">") or len(text.rstrip()) - 1 < m.end():
        return None
    return m.group(1).rsplit(".", 1)[-1] or None


@dataclass(frozen=True)
class ServerArgs:
    """One server start as its log states it: the raw arguments and the fields doctor and plan read.

    ``algorithm`` is normalised (``normalise_algorithm``), ``algorithm_raw`` is what the log wrote.
    ``num_steps``/``topk``/``num_draft_tokens``: SGLang's ``speculative_*`` values
    (``num_draft_tokens`` counts the tokens one verify pass checks, steps + 1 for a chain); vLLM's
    ``num_speculative_tokens`` k gives steps k, topk 1 and k + 1 draft tokens (a chain unless a
    ``speculative_token_tree`` is given). ``inferred`` lists every field the line did not print
    (taken from the engine's default or vLLM's engine config line). ``cuda_graph`` is ``not
    disable_cuda_graph`` / ``not enforce_eager``; ``prefix_cache`` is ``not disable_radix_cache`` /
    ``enable_prefix_caching`` (None when vLLM's default decides and no config line says).
    ``version`` is exact where the log prints it (vLLM); ``version_range`` is (first, last or
    None) of the releases that print a line like this one, narrowed by the fields it has (SGLang
    ``pp_size`` from 0.4.7, vLLM ``spec_method`` from 0.22.0, ``'***'`` from 0.29.0);
    ``version_hint`` says either in words. ``starts`` counts the arguments lines (a restarted
    server prints one per start; the record is the last one).
    """

    engine: str
    source: str
    line_no: int | None
    raw: dict = field(default_factory=dict, hash=False, compare=False, repr=False)
    engine_config: dict | None = field(default=None, hash=False, compare=False, repr=False)
    version: str | None = None
    version_hint: str | None = None
    model: str | None = None
    draft: str | None = None
    algorithm: str | None = None
    algorithm_raw: str | None = None
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    max_len: int | None = None
    decode_log_interval: int | None = None
    cuda_graph: bool | None = None
    prefix_cache: bool | None = None
    log_stats: bool | None = None
    inferred: tuple[str, ...] = ()
    starts: int = 1
    version_range: tuple[str, str | None] | None = None

    @property
    def speculative(self) -> bool:
        """Whether the server was started with a speculative algorithm."""
        return self.algorithm is not None

    def describe(self) -> str:
        """``EAGLE3 (draft d, 3 steps, topk 1, 4 draft tokens)`` or ``no speculative decoding``."""
        if not self.speculative:
            return "no speculative decoding"
        parts = [f"draft {self.draft}" if self.draft else "no draft path"]
        if self.engine == "sglang":
            for value, unit in ((self.num_steps, "steps"), (self.topk, None), (self.num_draft_tokens, "draft tokens")):
                if value is not None:
                    parts.append(f"topk {value}" if unit is None else f"{value} {unit}")
        elif self.num_steps is not None:
            parts.append(f"{self.num_steps} speculative tokens")
        return printable(f"{self.algorithm_raw or self.algorithm} ({', '.join(parts)})")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy: every field, ``raw`` and ``engine_config`` as plain JSON values."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else _plain(value)
        return out


def _plain(value: Any) -> Any:
    """JSON-safe copy: tuples/sets -> lists, non-finite floats -> their text, keys -> str."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, frozenset):
        return sorted((_plain(v) for v in value), key=repr)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def _int(value: Any) -> int | None:
    """An integer argument (ints, integral floats, digit strings); None otherwise."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,18}\s*", value):
        return int(value)
    return None


def _bool(value: Any) -> bool | None:
    """A flag: True/False, or their text; None otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def _str(value: Any) -> str | None:
    """A path or name argument: strings as they are, ``PosixPath('/x')`` -> '/x', others None."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get(ARGS_KEY), list) and value[ARGS_KEY]:
        first = value[ARGS_KEY][0]
        return first if isinstance(first, str) else None
    return None


def _not(value: bool | None) -> bool | None:
    return None if value is None else not value


# --- one line --------------------------------------------------------------------------------

def _kind(text: str, engine: str | None) -> tuple[str, re.Match] | None:
    """Which arguments-line kind ``text`` is (and its marker match), None for any other line."""
    for kind, needle, rx in _PROBES:
        if needle in text and (engine is None or kind.startswith(engine)):  # substring first: cheap on data lines
            m = rx.search(text)
            if m:
                return ("vllm-version" if kind == "vllm-logo" else kind), m
    return None


def _clean(line: str | bytes) -> str:
    if isinstance(line, (bytes, bytearray)):
        line = bytes(line).decode("utf-8", errors="replace")
    return _ANSI.sub("", str(line).rstrip("\r\n"))


def is_args_line(line: str | bytes, engine: str | None = None) -> bool:
    """Whether ``line`` is an arguments, engine-config or version line (never a metrics line)."""
    text = _clean(line)
    return len(text) <= MAX_ARGS_LINE and _kind(text, engine) is not None


def _read_value(text: str, what: str) -> Any:
    try:
        return parse_repr(text)
    except (ReprError, RecursionError, MemoryError) as exc:
        raise ReprError(f"{what}: {exc}") from None


def _sglang_record(raw: dict, source: str, line_no: int | None) -> ServerArgs:
    values: dict[str, Any] = {name: _int(raw.get(key)) for name, key in _SGLANG_FIELDS.items()}
    values["model"], values["draft"] = _str(raw.get("model_path")), _str(raw.get("speculative_draft_model_path"))
    algo = raw.get("speculative_algorithm")
    inferred = []
    if "pp_size" not in raw:  # releases before 0.4.7 have no pipeline parallelism
        values["pp"] = 1
        inferred.append("pp")
    if source == "sglang-repr":
        since = "0.4.7" if "pp_size" in raw else "0.4.3" if "speculative_algorithm" in raw else "0.4.0"
        span: tuple[str, str | None] = (since, _SGLANG_REPR_UNTIL)
        hint = f"sglang {since} - {_SGLANG_REPR_UNTIL}"
    else:
        span, hint = (_SGLANG_DICT_SINCE, None), f"sglang >= {_SGLANG_DICT_SINCE}"
    return ServerArgs(
        engine="sglang", source=source, line_no=line_no, raw=raw, version_hint=hint,
        algorithm=normalise_algorithm(algo), algorithm_raw=None if algo is None else str(algo),
        cuda_graph=_not(_bool(raw.get("disable_cuda_graph"))),
        prefix_cache=_not(_bool(raw.get("disable_radix_cache"))),
        log_stats=True, inferred=tuple(inferred), version_range=span, **values)


def _spec_dict(value: Any) -> dict:
    """vLLM's ``speculative_config``: a dict, or a JSON/repr string of one; keys with '-' folded to '_'."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            try:
                value = parse_repr(value)
            except (ReprError, RecursionError):
                return {}
    if not isinstance(value, dict):
        return {}
    return {str(k).replace("-", "_"): v for k, v in value.items()}


def _vllm_record(raw: dict | None, source: str, line_no: int | None, config: dict | None,
                 version: str | None) -> ServerArgs:
    """Fields from a non-default-args / Namespace dict, completed by the engine config line and defaults."""
    raw = raw or {}
    cfg = config or {}
    spec = _spec_dict(raw.get("speculative_config"))
    cfg_spec = cfg.get("speculative_config") if isinstance(cfg.get("speculative_config"), dict) else {}
    inferred: list[str] = []
    values: dict[str, Any] = {}

    def pick(name: str, given: Any, resolved: Any, default: Any = None) -> None:
        if given is not None:
            values[name] = given
        elif resolved is not None:
            values[name] = resolved
            inferred.append(name)
        elif default is not None:
            values[name] = default
            inferred.append(name)
        else:
            values[name] = None

    method = spec.get("method", raw.get("spec_method"))
    if method is None and cfg_spec:
        method = cfg_spec.get("method")
        if method is not None:
            inferred.append("algorithm")
    pick("model", _str(raw.get("model_tag")) or _str(raw.get("model")), _str(cfg.get("model")))
    pick("draft", _str(spec.get("model", raw.get("spec_model"))), _str(cfg_spec.get("model")))
    pick("num_steps", _int(spec.get("num_speculative_tokens", raw.get("spec_tokens"))),
         _int(cfg_spec.get("num_spec_tokens")))
    pick("tp", _int(raw.get("tensor_parallel_size")), _int(cfg.get("tensor_parallel_size")), 1)
    pick("pp", _int(raw.get("pipeline_parallel_size")), _int(cfg.get("pipeline_parallel_size")), 1)
    pick("dp", _int(raw.get("data_parallel_size")), _int(cfg.get("data_parallel_size")), 1)
    pick("max_len", _int(raw.get("max_model_len")), _int(cfg.get("max_seq_len")))
    pick("cuda_graph", _not(_bool(raw.get("enforce_eager"))), _not(_bool(cfg.get("enforce_eager"))), True)
    pick("prefix_cache", _bool(raw.get("enable_prefix_caching")), _bool(cfg.get("enable_prefix_caching")))
    pick("log_stats", _not(_bool(raw.get("disable_log_stats"))), None, True)
    algorithm = normalise_algorithm(method)
    if algorithm is not None and values["num_steps"] is not None and "speculative_token_tree" not in spec:
        values["topk"] = 1  # vLLM drafts a chain unless a token tree is given
        values["num_draft_tokens"] = values["num_steps"] + 1  # tokens per verify pass, SGLang's meaning
        inferred += ["topk", "num_draft_tokens"]
    if version:
        span: tuple[str, str | None] = (version, version)
    else:
        since = "0.29.0" if "***" in raw.values() else "0.22.0" if {"spec_method", "spec_model", "spec_tokens"} & set(raw) \
            else "0.10.0"
        span = (since, None)
    hint = f"vllm {version}" if version else f"vllm >= {span[0]}"
    return ServerArgs(engine="vllm", source=source, line_no=line_no, raw=raw, engine_config=config,
                      version=version, version_hint=hint, version_range=span, algorithm=algorithm,
                      algorithm_raw=None if method is None else str(method),
                      inferred=tuple(dict.fromkeys(inferred)), **values)


def _engine_config(text: str) -> dict:
    """The ``key=value, ...`` of vLLM's engine config line; values that are no repr stay text."""
    out: dict[str, Any] = {}
    for key, value in split_assignments(text):
        try:
            parsed = parse_repr(value)
        except (ReprError, RecursionError):
            parsed = value
        if isinstance(parsed, dict) and parsed.get(CALL_KEY) == "SpeculativeConfig":
            parsed = {k: v for k, v in parsed.items() if k != CALL_KEY}
        out[key] = parsed
    return out


def _parse(text: str, kind: str, m: re.Match, line_no: int | None) -> tuple[str, Any]:
    """(kind, value) for one recognised line; ReprError when it is damaged."""
    if len(text) > MAX_ARGS_LINE:
        raise ReprError(f"arguments line longer than {MAX_ARGS_LINE // 1024} KiB")
    body = text[m.end():].rstrip()
    if kind == "sglang":
        value = _read_value(body, "server_args")
        if isinstance(value, dict) and value.get(CALL_KEY) == "ServerArgs":
            return "sglang-repr", {k: v for k, v in value.items() if k not in (CALL_KEY, ARGS_KEY)}
        if isinstance(value, dict) and CALL_KEY not in value:
            return "sglang-dict", value
        raise ReprError("server_args is neither ServerArgs(...) nor a dict")
    if kind == "vllm-non-default":
        value = _read_value(body, "non-default args")
        if not isinstance(value, dict) or CALL_KEY in value:
            raise ReprError("non-default args is not a dict")
        return kind, value
    if kind == "vllm-namespace":
        value = _read_value(body, "args")
        if not isinstance(value, dict) or value.get(CALL_KEY) != "Namespace":
            raise ReprError("args is not Namespace(...)")
        return kind, {k: v for k, v in value.items() if k not in (CALL_KEY, ARGS_KEY)}
    if kind == "vllm-engine-config":
        try:
            return kind, (m.group(1), _engine_config(body))
        except (ReprError, RecursionError) as exc:
            raise ReprError(f"engine config: {exc}") from None
    return "vllm-version", m.group(1)


def parse_server_args_line(line: str | bytes, *, engine: str | None = None, line_no: int | None = None,
                           strict: bool = False) -> ServerArgs | None:
    """The launch arguments of one log line, or None when the line holds none.

    Reads SGLang ``server_args=...``, vLLM ``non-default args: {...}``, ``args: Namespace(...)`` and
    the engine config line (version lines alone give None). A damaged arguments line (unbalanced,
    too deep, too long) gives None, or with ``strict`` a one-line ForensicsError saying why.
    """
    if engine is not None and engine not in ENGINES:
        raise ForensicsError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    text = _clean(line)
    if len(text) > MAX_ARGS_LINE:
        if strict and _kind(text[:4096], engine):
            raise ForensicsError(f"arguments line longer than {MAX_ARGS_LINE // 1024} KiB")
        return None
    found = _kind(text, engine)
    if found is None:
        return None
    try:
        kind, value = _parse(text, found[0], found[1], line_no)
    except ReprError as exc:
        if strict:
            raise ForensicsError(f"damaged arguments line{f' {line_no}' if line_no else ''}: {exc}") from None
        return None
    if kind == "vllm-version":
        return None
    if kind.startswith("sglang"):
        rec = _sglang_record(value, kind, line_no)
    elif kind == "vllm-engine-config":
        rec = _vllm_record(None, kind, line_no, value[1], value[0])
    else:
        rec = _vllm_record(value, kind, line_no, None, None)
    why = out_of_bounds(rec)
    if why and strict:
        raise ForensicsError(f"arguments line{f' {line_no}' if line_no else ''}: {why}")
    return None if why else rec


_VLLM_NAMES = {"num_steps": "num_speculative_tokens", "tp": "tensor_parallel_size", "pp": "pipeline_parallel_size",
               "dp": "data_parallel_size", "max_len": "max_model_len"}


def out_of_bounds(rec: ServerArgs) -> str | None:
    """Why a launch's integer is past what the engines accept (``io.bounds.LAUNCH_INTS``), or None.

    Checked where the log is read: ``pipeline_parallel_size`` = 10^9 would make a billion pipeline stages."""
    for name, bound in LAUNCH_INTS.items():
        why = past_bound(getattr(rec, name), bound, "draft steps" if name == "num_steps" else "")
        if why:
            field_name = _SGLANG_FIELDS[name] if rec.engine == "sglang" else _VLLM_NAMES.get(name, name)
            return f"{field_name} is {why}"
    return None


# --- a whole log -----------------------------------------------------------------------------

class ServerArgsScanner:
    """Feed a log line by line; ``result()`` is the last server start with its vLLM config and version (a value past
    what the engines accept, ``out_of_bounds``, is one line naming ``path`` and the line).

    ``feed`` returns True for every arguments, engine-config and version line (so the caller never
    reads it as metrics), also for a damaged one, which is listed in ``damaged`` as
    ``(line number, reason)``.
    """

    def __init__(self, engine: str | None = None, path: str | Path | None = None) -> None:
        if engine is not None and engine not in ENGINES:
            raise ForensicsError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
        self.engine = engine
        self.path = path  # named by the error for a launch value past its bound
        self.damaged: list[tuple[int, str]] = []
        self._blocks: list[dict[str, Any]] = []
        self._starts = 0

    def _block(self, new: bool) -> dict[str, Any]:
        if new or not self._blocks:
            self._blocks.append({})
        return self._blocks[-1]

    def feed(self, line_no: int, line: str | bytes) -> bool:
        text = _clean(line)
        probe = text if len(text) <= MAX_ARGS_LINE else text[:4096]
        found = _kind(probe, self.engine)
        if found is None:
            return False
        try:
            if probe is not text:
                raise ReprError(f"arguments line longer than {MAX_ARGS_LINE // 1024} KiB")
            kind, value = _parse(text, found[0], found[1], line_no)
        except ReprError as exc:
            self.damaged.append((line_no, " ".join(str(exc).split())[:200]))
            return True
        current = self._blocks[-1] if self._blocks else {}
        if kind == "vllm-version":
            block = self._block(new=bool(current) and ("args" in current or "version" in current))
            block["version"] = value
        elif kind == "vllm-engine-config":
            block = self._block(new=bool(current) and "config" in current)
            block["config"] = (line_no, value)
        else:
            self._starts += 1
            block = self._block(new=bool(current) and ("args" in current or "config" in current))
            block["args"] = (line_no, kind, value)
        return True

    def result(self) -> ServerArgs | None:
        """The last start's record (None when the log has no arguments or engine config line)."""
        for block in reversed(self._blocks):
            if "args" not in block and "config" not in block:
                continue
            starts = max(self._starts, 1)
            if "args" in block and block["args"][1].startswith("sglang"):
                line_no, kind, raw = block["args"]
                rec = _sglang_record(raw, kind, line_no)
            else:
                line_no, kind, raw = block.get("args", (None, None, None))
                cfg_line, (cfg_version, config) = block.get("config", (None, (None, None)))
                version = block.get("version") or cfg_version
                rec = _vllm_record(raw, kind or "vllm-engine-config", line_no if line_no else cfg_line,
                                   config, version)
            why = out_of_bounds(rec)
            if why:
                raise ForensicsError(f"line {rec.line_no}: {why}", path=self.path)
            return replace(rec, starts=starts)
        return None


def find_server_args(source: str | os.PathLike[str] | Iterable[str | bytes], engine: str | None = None
                     ) -> ServerArgs | None:
    """The launch arguments of a server log (a path, plain or gzipped, or an iterable of lines).

    The last server start wins when the log holds several; None when it holds no arguments line.
    A path that cannot be read is a ForensicsError naming it (the log reader's checks).
    """
    scanner = ServerArgsScanner(engine, source if isinstance(source, (str, os.PathLike)) else None)
    if isinstance(source, (str, os.PathLike)):

        for number, line in read_lines(Path(source)):
            scanner.feed(number, line)
    else:
        for number, line in enumerate(source, start=1):
            scanner.feed(number, line)
    return scanner.result()


def describe_formats() -> list[dict[str, Any]]:
    """``FORMATS`` as records (engine, since, until, source, where), for docs and tests."""
    return [dict(zip(("engine", "since", "until", "source", "where"), row)) for row in FORMATS]


def summary_of(args: ServerArgs | None) -> Mapping[str, Any]:
    """The four fields ``plan`` and the runs table read: algorithm, num_steps, topk, num_draft_tokens."""
    if args is None:
        return {"algorithm": None, "num_steps": None, "topk": None, "num_draft_tokens": None}
    return {"algorithm": args.algorithm, "num_steps": args.num_steps, "topk": args.topk,
            "num_draft_tokens": args.num_draft_tokens}
