"""``eagleforensics logs``: compare runs by the acceptance and throughput their server logs report."""
from __future__ import annotations

import json
import math

import click

from ..errors import ForensicsError
from .common import run_guarded


def parse_run_args(pairs: tuple[str, ...]) -> dict[str, str]:
    """Turn ``LABEL=PATH`` arguments into an ordered mapping; ForensicsError on a malformed or repeated label."""
    runs: dict[str, str] = {}
    for pair in pairs:
        label, sep, path = pair.partition("=")
        label, path = label.strip(), path.strip()
        if not sep or not label or not path:
            raise ForensicsError(f"expected LABEL=PATH, got {pair!r}")
        if label in runs:
            raise ForensicsError(f"run label {label!r} given twice")
        runs[label] = path
    return runs


@click.command("logs")
@click.argument("runs", nargs=-1, required=True, metavar="LABEL=PATH...")
@click.option("--baseline", metavar="LABEL", default=None,
              help="Run whose median tok/s the others are divided by (speedup column).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON records instead of a table.")
def logs(runs: tuple[str, ...], baseline: str | None, as_json: bool) -> None:
    """Summarise SGLang/vLLM server logs per run: median accept length, accept rate, tok/s, speed-up.

    Each RUN is LABEL=PATH, e.g. ``baseline=base.log broken=eagle.log fixed=eagle_fixed.log``.
    Only the engines' decode/metrics lines count; other lines mentioning "accept" are ignored.
    """

    def body() -> None:
        from ..logs import parse_logs, summarize_runs  # pandas loads here, not for --help

        mapping = parse_run_args(runs)
        if baseline is not None and baseline not in mapping:
            raise ForensicsError(
                f"--baseline {baseline!r} is not one of the run labels: {', '.join(mapping)}"
            )
        df = parse_logs(mapping)
        for label in df.attrs.get("empty_runs", []):
            raise ForensicsError(
                "no SGLang 'Decode batch' or vLLM metrics line found (is this the server log?)",
                path=mapping[label],
            )
        summary = summarize_runs(df, baseline=baseline)
        if as_json:
            records = [
                {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()}
                for rec in summary.to_dict(orient="records")
            ]
            click.echo(json.dumps(records, indent=2, default=str))
        else:
            click.echo(summary.to_string(index=False, na_rep="n/a", float_format=lambda v: f"{v:.3f}"))

    run_guarded(body)
