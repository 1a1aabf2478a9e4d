"""Read SGLang and vLLM server logs into one table, to prove with the engine's own numbers that a fix worked.

One row per data line of a log: the acceptance length, acceptance rate, generation
throughput and running requests the engine printed, with the line's time and number.
Everything else (warnings, prefill lines, request logs) is ignored, even when it mentions
"accept". The server's arguments line (and vLLM's engine config and version lines) is read apart,
by ``engines.serverargs``, before a line is tried as data, so it is never counted as metrics: each
parsed log carries its last server start in ``attrs["server_args"]``, and ``summarize_runs`` adds
each run's algorithm, steps, topk and draft tokens.

Formats read, as checked in each engine's released source:

SGLang decode line (logger prefix ``[%Y-%m-%d %H:%M:%S(.mmm)( DPd)( TPd)...] ``, from
``configure_logger``; ``.mmm`` with SGLANG_LOG_MS; rank tags only when that size is > 1), re-read
in the released wheels 0.5.3, 0.5.4, 0.5.5.post2, 0.5.5.post3, 0.5.9 - 0.5.13:
    ``Decode batch[ [iter]], #running-req: N, #token: T, token usage: U, [accept len: L,
    [accept rate: R, ]]cuda graph: B, gen throughput (token/s): G, #queue-req: Q[, ]``
  Where: python/sglang/srt/managers/scheduler_metrics_mixin.py up to 0.5.9,
    .../srt/observability/scheduler_metrics_mixin.py 0.5.10 - 0.5.12.post1,
    .../srt/managers/scheduler_components/metrics_reporter.py from 0.5.13. The trailing ", "
    after #queue-req was dropped in 0.5.9.
  ``accept len`` only (no rate) up to 0.5.3; ``accept len: L, accept rate: R`` from 0.5.4.
  R changed meaning twice, so compare accept LENGTH across versions, never the rate:
    0.5.4 - 0.5.5.post2: accepted tokens / (verify steps * (speculative_num_steps + 1));
    0.5.5.post3 - 0.5.10: accepted tokens / (verify steps * num_draft_tokens) (sglang PR #13212),
      i.e. L / num_draft_tokens, never below 1 / num_draft_tokens even when no draft is accepted;
    from 0.5.11: accepted DRAFTS (accepted tokens - verify steps) / (verify steps *
      (num_draft_tokens - 1)) (sglang PR #23530), i.e. (L - 1) / steps. The same decoding logs
      R = 0.40 before 0.5.11 and 0.20 from it for L = 1.6 with 4 draft tokens; L did not change.
vLLM (prefix ``(APIServer pid=P) INFO %m-%d %H:%M:%S [file.py:line] ``; older releases omit the
``(process pid=P) `` part; the date has no year), 0.33.0 and 0.34.0 (both files read, the same fields):
  vllm/v1/metrics/loggers.py ``LoggingStatLogger.log``:
    ``Engine 000: Avg prompt throughput: X tokens/s, Avg generation throughput: G tokens/s,
    Running: N reqs, Waiting: W reqs, ...``
  vllm/v1/spec_decode/metrics.py ``SpecDecodingLogging.log``:
    ``SpecDecoding metrics: Mean acceptance length: L, Accepted throughput: A tokens/s, Drafted
    throughput: D tokens/s, Accepted: a tokens, Drafted: d tokens, Per-position acceptance rate:
    p0, p1, ..., Avg Draft acceptance rate: R%`` (L includes the bonus token; R = a / d).
Fields are read by name, not position, so lines that add or reorder fields still parse.
"""
from __future__ import annotations

import math
import re
import zlib
from datetime import datetime, timedelta
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import pandas as pd

from ..errors import ForensicsError
from ..io import physical
from .launchrules import stats_interval
from .loglines import open_text
from .serverargs import ServerArgs, ServerArgsScanner, summary_of

ENGINES = ("sglang", "vllm")
COLUMNS = [
    "run", "time", "line", "engine", "rank", "accept_length", "accept_rate",
    "gen_throughput", "running_req", "per_position_acceptance", "draft_acceptance_rate",
]
SUMMARY_COLUMNS = [
    "run", "engine", "n_lines", "median_accept_length", "median_accept_rate",
    "median_tok_s", "speedup", "algorithm", "num_steps", "topk", "num_draft_tokens",
]
# The summary columns read from each run's server arguments line (None when the log has none).
ARGS_COLUMNS = ["algorithm", "num_steps", "topk", "num_draft_tokens"]
_MEASURED_COLUMNS = [c for c in SUMMARY_COLUMNS if c not in ARGS_COLUMNS]
# vLLM prints month-day only; this leap year stands in so that 02-29 still parses.
PLACEHOLDER_YEAR = 2000

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SGLANG_PREFIX = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(\d{1,6}))?((?: [A-Z][A-Z_]*\d+)*)\] "
)
# ``[file.py:123] ``: vLLM's shortened source path (vllm/logging_utils/formatter.py 0.33.0, 0.34.0); bounded and free of
# brackets, so a line of repeated prefixes without a closing bracket is not scanned to its end from every one.
_VLLM_PREFIX = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)? \[[^\[\]\n]{0,256}\] "
)
_SGLANG_DECODE = re.compile(r"Decode batch(?: \[\d+\])?[.,] (#running-req: .*)$")
_VLLM_SPEC = re.compile(r"SpecDecoding metrics: (.*)$")
_VLLM_THROUGHPUT = re.compile(r"(?:Engine (\d+): )?(Avg prompt throughput: .*)$")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf", re.IGNORECASE)
# No engine prints a line this long (server-args dumps are tens of KiB); past it the file is not a log.


def _fields(text: str) -> dict[str, str]:
    """Split ``key: value, key: value`` into a dict; a part without ``: `` continues the previous value."""
    out: dict[str, str] = {}
    last: str | None = None
    for part in text.split(", "):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition(": ")
        if sep:
            last = key.strip()
            out[last] = value.strip()
        elif last is not None:
            out[last] = f"{out[last]}, {part}"
    return out


def _num(text: str | None) -> float:
    """First number in ``text`` (units like ``%`` or ``reqs`` dropped); NaN when there is none."""
    if text is None:
        return math.nan
    m = _NUMBER.match(text.strip())
    return float(m.group(0)) if m else math.nan


def _count(text: str | None) -> int | None:
    """An integer field such as ``1 reqs``; None when absent or not a finite number; a ValueError (the line is
    damaged) past ``physical.MAX_RUNNING_REQ`` or not whole."""
    value = _num(text)
    why = physical.running_problem(value)
    if why:
        raise ValueError(why)
    return int(value) if math.isfinite(value) else None


def _line_time(line: str, engine: str) -> tuple[datetime | None, str | None]:
    """The time (and SGLang rank tag) from the engine's logging prefix; (None, None) without one."""
    if engine == "sglang":
        m = _SGLANG_PREFIX.search(line)
        if not m:
            return None, None
        stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
        if m.group(2):
            stamp += timedelta(microseconds=int(m.group(2).ljust(6, "0")))
        return stamp, (m.group(3).strip() or None)
    m = _VLLM_PREFIX.search(line)
    if not m:
        return None, None
    return datetime.strptime(f"{PLACEHOLDER_YEAR}-{m.group(1)}", "%Y-%m-%d %H:%M:%S"), None


def _sglang_row(line: str) -> dict | None:
    """Values of an SGLang decode-batch line, or None when the line is not one."""
    m = _SGLANG_DECODE.search(line)
    if not m:
        return None
    f = _fields(m.group(1))
    row = {
        "accept_length": _num(f.get("accept len")),
        "accept_rate": _num(f.get("accept rate")),
        "gen_throughput": _num(f.get("gen throughput (token/s)")),
        "running_req": _count(f.get("#running-req")),
    }
    if math.isnan(row["accept_length"]) and math.isnan(row["gen_throughput"]):
        return None
    return row


def _vllm_row(line: str) -> dict | None:
    """Values of a vLLM SpecDecoding-metrics or throughput line, or None when the line is neither."""
    m = _VLLM_SPEC.search(line)
    if m:
        f = _fields(m.group(1))
        pct = _num(f.get("Avg Draft acceptance rate", f.get("Draft acceptance rate")))
        accepted, drafted = _num(f.get("Accepted")), _num(f.get("Drafted"))
        if math.isnan(pct) and drafted > 0:
            pct = 100.0 * accepted / drafted
        per_pos = f.get("Per-position acceptance rate")
        row = {
            "accept_length": _num(f.get("Mean acceptance length")),
            "accept_rate": pct / 100.0,
            "draft_acceptance_rate": pct,
            "per_position_acceptance": (
                [_num(p) for p in per_pos.split(",") if p.strip()] if per_pos else None
            ),
        }
        return row if not (math.isnan(row["accept_length"]) and math.isnan(pct)) else None
    m = _VLLM_THROUGHPUT.search(line)
    if m:
        f = _fields(m.group(2))
        gen = _num(f.get("Avg generation throughput"))
        if math.isnan(gen):
            return None
        return {
            "gen_throughput": gen,
            "running_req": _count(f.get("Running")),
            "rank": f"Engine {m.group(1)}" if m.group(1) else None,
        }
    return None


def _physical(row: dict | None) -> dict | None:
    """``row`` unchanged, or a ValueError (the line is damaged) when a number is past a physical bound."""
    if row is None:
        return None
    gen, running = row.get("gen_throughput", math.nan), row.get("running_req")
    why = physical.tok_s_problem(gen) if gen is not None else None
    why = why or (physical.running_problem(running) if running is not None else None)
    length = row.get("accept_length", math.nan)
    why = why or physical.accept_problem(length if length is not None else math.nan, physical.MAX_ENGINE_STEPS)
    per_pos = row.get("per_position_acceptance")
    if not why and per_pos is not None and len(per_pos) > physical.MAX_ENGINE_STEPS:
        why = physical.steps_problem(len(per_pos))
    if why:
        raise ValueError(why)
    return row


_PARSERS = {"sglang": lambda line: _physical(_sglang_row(line)), "vllm": lambda line: _physical(_vllm_row(line))}


def _iter_rows(lines: Iterable[str], engine: str | None, seen: list[int],
               scanner: ServerArgsScanner | None = None) -> Iterator[tuple[str, dict]]:
    """Yield (engine, row) per data line; with engine None the first data line decides the engine.

    An arguments, engine-config or version line goes to ``scanner`` and is never tried as data.
    """
    for number, raw in enumerate(lines, start=1):
        seen[0] = number
        text = _ANSI.sub("", raw.rstrip("\r\n"))
        if not text.strip() or text.lstrip().startswith("#"):
            continue  # blank lines and comment lines (fixture headers) are not log lines
        if scanner is not None and scanner.feed(number, text):
            continue
        for name in (engine,) if engine else ENGINES:
            row = _PARSERS[name](text)
            if row is None:
                continue
            engine = name
            stamp, rank = _line_time(text, name)
            row.setdefault("rank", rank)
            row.update(time=stamp, line=number, engine=name)
            yield name, row
            break


def _frame(rows: list[dict], run: str) -> pd.DataFrame:
    """Build the table with stable columns and dtypes, also when there are no rows."""
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["run"] = run
    df["time"] = pd.to_datetime(df["time"])
    df["line"] = df["line"].astype("int64")
    for col in ("accept_length", "accept_rate", "gen_throughput", "draft_acceptance_rate"):
        df[col] = df[col].astype("float64")
    df["running_req"] = df["running_req"].astype("Int64")
    for col in ("engine", "rank", "per_position_acceptance"):
        df[col] = df[col].astype("object").where(df[col].notna(), None)
    return df


def parse_log(path: str | Path, run: str | None = None, engine: str | None = None) -> pd.DataFrame:
    """Parse one SGLang or vLLM server log into one row per data line (columns ``COLUMNS``).

    ``run`` labels the rows (default: the file name without suffix). ``engine`` restricts parsing
    to 'sglang' or 'vllm'; None detects it from the first data line. A log with no data line gives
    an empty frame with the same columns and ``df.attrs["engine"] is None``. ``df.attrs`` also
    holds ``path``, ``lines_read``, ``server_args`` (the last server start's
    ``serverargs.ServerArgs``, None without an arguments line) and ``args_damaged`` ((line,
    reason) per arguments line too damaged to read). vLLM times carry ``PLACEHOLDER_YEAR``.
    """
    if engine is not None and engine not in ENGINES:
        raise ForensicsError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    p = Path(path)
    seen = [0]
    scanner = ServerArgsScanner(engine, p)
    with open_text(p) as fh:
        try:
            found = list(_iter_rows(fh, engine, seen, scanner))
        except (OSError, EOFError, zlib.error) as exc:
            raise ForensicsError(f"cannot read log file past line {seen[0]}: {exc}", path=p) from None
        except ValueError as exc:  # a logging prefix that is no date (2000-11-39): the line is damaged
            raise ForensicsError(f"line {seen[0]} is damaged: {' '.join(str(exc).split())[:160]}", path=p) from None
    df = _frame([row for _, row in found], run if run is not None else _default_label(p))
    df.attrs.update(path=str(p), engine=found[0][0] if found else None, lines_read=seen[0],
                    server_args=scanner.result(), args_damaged=list(scanner.damaged))
    return df


def default_label(path: str | Path) -> str:
    """Run label from a file name: ``runs/fixed.log.gz`` -> ``fixed`` (what ``logs PATH`` uses without ``LABEL=``)."""
    return _default_label(Path(path))


def _default_label(path: Path) -> str:
    """Run label from a file name: ``runs/fixed.log.gz`` -> ``fixed``."""
    name = path.name
    for suffix in (".gz", ".log", ".txt"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return name


def parse_logs(mapping: Mapping[str, str | Path], engine: str | None = None) -> pd.DataFrame:
    """Parse several logs, one run label each, into one frame.

    ``attrs``: ``empty_runs`` (runs without data lines), ``waiting_runs`` (those of them whose log
    has a server arguments line: a server that has not logged statistics yet), ``runs`` (every
    label, in order) and ``server_args_by_run`` (label -> ``ServerArgs`` or None).
    """
    frames, empty, waiting, by_run = [], [], [], {}
    for label, path in mapping.items():
        df = parse_log(path, run=str(label), engine=engine)
        by_run[str(label)] = df.attrs.get("server_args")
        if df.empty:
            empty.append(str(label))
            if by_run[str(label)] is not None:
                waiting.append(str(label))
        else:
            frames.append(df)
    out = pd.concat(frames, ignore_index=True) if frames else _frame([], "")
    out.attrs = {"empty_runs": empty, "waiting_runs": waiting, "runs": list(by_run),
                 "server_args_by_run": by_run}
    return out


def waiting_message(args: ServerArgs) -> str:
    """What to tell about a log whose server started (``args``) but printed no decode or metrics line yet."""
    started = f"server started with {args.describe()}"
    row = stats_interval(args.engine, args.version)
    if args.engine == "sglang":
        interval = args.decode_log_interval
        default = int(row.default) if row is not None else None
        shown = interval if interval is not None else default
        n = f"{shown} here" if interval is not None else f"{shown} by default"
        return (f"{started}; no decode statistics yet: SGLang prints a 'Decode batch' line every "
                f"decode_log_interval decode batches ({n}); send a longer request")
    if args.log_stats is False:
        return (f"{started}; no metrics yet: this vLLM server was started with --disable-log-stats, so it "
                "never prints throughput or SpecDecoding metrics lines; restart without it")
    every = "every 10 s" if row is None or row.setting == "fixed" else \
        "every VLLM_LOG_STATS_INTERVAL seconds (10 by default)"
    return (f"{started}; no metrics yet: vLLM prints its throughput and SpecDecoding metrics lines {every}, "
            "and only for intervals in which tokens were processed; send a request that runs longer "
            "than one interval")


def _median(series: pd.Series) -> float:
    """Median of the non-missing values; NaN when there are none."""
    values = series.dropna()
    return float(values.median()) if len(values) else math.nan


def summarize_runs(df: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """One row per run (in the order given to ``parse_logs``, else first seen): data lines, medians, speed-up, launch.

    The tok/s median skips intervals with zero running requests (vLLM logs those when a request
    ends or the server idles): they measure no decoding. ``speedup`` is the run's median tok/s over
    the baseline run's, NaN without a baseline. Accept rates follow each engine's own definition
    (see the module docstring), so compare them only between runs of one definition.
    """
    missing = [c for c in ("run", "engine", "accept_length", "accept_rate",
                           "gen_throughput", "running_req") if c not in df.columns]
    if missing:
        raise ForensicsError(f"not a parsed-log table: missing columns {', '.join(missing)}")
    runs = list(dict.fromkeys([*df.attrs.get("runs", []), *df["run"]]))
    if baseline is not None and baseline not in runs:
        known = ", ".join(map(str, runs)) or "none"
        raise ForensicsError(f"baseline run {baseline!r} not found; runs: {known}")
    rows = []
    for run in runs:
        sub = df[df["run"] == run]
        busy = sub[~(sub["running_req"].fillna(1) == 0)]
        engines = sub["engine"].dropna()
        rows.append({
            "run": run,
            "engine": engines.iloc[0] if len(engines) else None,
            "n_lines": int(len(sub)),
            "median_accept_length": _median(sub["accept_length"]),
            "median_accept_rate": _median(sub["accept_rate"]),
            "median_tok_s": _median(busy["gen_throughput"]),
        })
    out = pd.DataFrame(rows, columns=_MEASURED_COLUMNS[:-1])
    base = math.nan
    if baseline is not None:
        base = float(out.loc[out["run"] == baseline, "median_tok_s"].iloc[0])
    # a speed-up only between finite, positive rates: a logged "inf" or "nan" tok/s (or one past
    # the float range) is no rate, and x / inf = 0 would read as "stopped", x / nan as nothing
    rate = out["median_tok_s"].where(out["median_tok_s"].map(lambda v: math.isfinite(v) and v >= 0))
    out["speedup"] = rate / base if math.isfinite(base) and base > 0 else math.nan
    out["n_lines"] = out["n_lines"].astype("int64")
    by_run = _server_args_by_run(df, runs)
    out["engine"] = [by_run[r].engine if by_run.get(r) is not None and not isinstance(e, str) else e
                     for r, e in zip(out["run"], out["engine"])]
    for col in ARGS_COLUMNS:
        out[col] = pd.Series([summary_of(by_run.get(r))[col] for r in out["run"]], index=out.index, dtype="object")
    notes = []
    if baseline is not None and not math.isfinite(base):
        notes.append(f"the baseline run {baseline!r} logged a median tok/s of {base}, not a finite rate: no speed-up "
                     "is computed against it (n/a)")
    for run, value in zip(out["run"], out["median_tok_s"]):
        if not math.isnan(value) and not (math.isfinite(value) and value >= 0) and run != baseline:
            notes.append(f"run {run!r} logged a median tok/s of {value}, not a finite rate: its speed-up is n/a")
    out = out[SUMMARY_COLUMNS]
    out.attrs = {"server_args_by_run": {r: by_run.get(r) for r in out["run"]}, "notes": notes}
    return out


def _server_args_by_run(df: pd.DataFrame, runs: list) -> dict:
    """Run label -> ServerArgs from ``parse_logs`` (or a single ``parse_log`` frame's own)."""
    by_run = df.attrs.get("server_args_by_run")
    if isinstance(by_run, Mapping):
        return dict(by_run)
    own = df.attrs.get("server_args")
    return {runs[0]: own} if own is not None and len(runs) == 1 else {}
