"""``eagleforensics scan DATASET_DIR``: inspect every training record, write one JSON line each, list the outliers."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..errors import ForensicsError, printable
from ..interrupts import exit_code, what
from .common import echo_text, run_guarded

CAPTURE_CONVENTIONS = ("hf", "vllm", "sglang", "trtllm")


def default_output(dataset: str) -> Path:
    """``./<dataset name>.scan.jsonl`` in the current directory (never inside the dataset)."""
    name = Path(dataset).resolve().name or "dataset"
    return Path.cwd() / f"{name}.scan.jsonl"


@click.command()
@click.argument("dataset_dir", type=click.Path())
@click.option("--reference", type=click.Path(), default=None,
              help="Capture sweep to compare slots with (norm statistics; exact on opening tokens the records share with it).")
@click.option("--reference-convention", type=click.Choice(CAPTURE_CONVENTIONS), default="hf", show_default=True,
              help="What the integers in the reference capture mean.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Local worker processes [default: CPU count].")
@click.option("--scheduler", default=None, metavar="tcp://HOST:PORT",
              help="Run on this existing Dask scheduler instead (its workers must see DATASET_DIR at the same path).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Results file, one JSON line per record [default: ./<dataset name>.scan.jsonl].")
@click.option("--resume", is_flag=True, help="Continue the scan in the results file: skip records it already holds.")
@click.option("--json", "as_json", is_flag=True, help="Print the overview and outliers as JSON instead of tables.")
@click.option("--allow-unsafe-pickle", is_flag=True,
              help="Allow full unpickling of .pt files. DANGEROUS: runs any code the files contain; trusted data only.")
def scan(dataset_dir: str, reference: str | None, reference_convention: str, workers: int | None,
         scheduler: str | None, output: str | None, resume: bool, as_json: bool, allow_unsafe_pickle: bool) -> None:
    """Check every record of a training dataset: layout, NaN/Inf, padding vs loss mask, per-slot norm signature.

    Reads SpecForge rows_*/data_*.ckpt[.gz], speculators hs_*.safetensors and ModelOpt *.pt
    files. Exit 0: no outlier. 1: outlier records listed. 2: bad input.
    """
    from ..scan.runner import scan as run_scan

    out = Path(output) if output is not None else default_output(dataset_dir)

    def body():  # type: ignore[no-untyped-def]
        if scheduler is not None and "://" not in scheduler:
            raise ForensicsError(f"--scheduler takes a Dask address like tcp://HOST:PORT, got {scheduler!r}")
        try:
            return run_scan(dataset_dir, reference=reference, output=out, resume=resume, workers=workers,
                            scheduler=scheduler, allow_unsafe=allow_unsafe_pickle, convention=reference_convention)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (interrupts.Terminated)
            click.echo(f"eagleforensics: {what(exc)}; the records scanned so far are in {printable(out)}: "
                       "run the same command with --resume to continue", err=True)
            sys.exit(exit_code(exc))

    result = run_guarded(body)
    echo_text(json.dumps(result.to_dict(), indent=2) if as_json else result.to_text() + f"\n\nresults: {printable(out)}")
    sys.exit(result.exit_code)
