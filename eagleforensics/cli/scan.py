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
@click.option("--target", type=click.Path(), default=None,
              help="Target model directory: audit the training data against it (agreement of the supervised tokens "
                   "with its lm_head; chat template, thinking mode and loss mask against its tokenizer).")
@click.option("--served-prompts", type=click.Path(), default=None,
              help="With --target: JSONL of served requests to compare the records' template and thinking mode with.")
@click.option("--served-len", type=click.IntRange(min=1), default=None,
              help="With --target: the longest context the server serves, in tokens.")
@click.option("--agreement-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="With --target: supervised tokens scored per record (evenly spread).")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Local worker processes [default: CPU count].")
@click.option("--scheduler", default=None, metavar="tcp://HOST:PORT",
              help="Run on this existing Dask scheduler instead (its workers must see DATASET_DIR at the same path).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Results file, one JSON line per record [default: ./<dataset name>.scan.jsonl].")
@click.option("--resume", is_flag=True, help="Continue the scan in the results file: skip records it already holds.")
@click.option("--json", "as_json", is_flag=True, help="Print the overview and outliers as JSON instead of tables.")
@click.option("--allow-unsafe-pickle", is_flag=True,
              help="Allow full unpickling of .pt files. DANGEROUS: runs any code the files contain; trusted data only.")
def scan(dataset_dir: str, reference: str | None, reference_convention: str, target: str | None,
         served_prompts: str | None, served_len: int | None, agreement_tokens: int, workers: int | None,
         scheduler: str | None, output: str | None, resume: bool, as_json: bool, allow_unsafe_pickle: bool) -> None:
    """Check every record of a training dataset: layout, NaN/Inf, padding vs loss mask, per-slot norm signature.

    Reads SpecForge rows_*/data_*.ckpt[.gz], speculators hs_*.safetensors and ModelOpt *.pt
    files. With --target, also audits the training data against the target: were the answers
    written by it, in the chat template and thinking mode the server uses, with the loss mask on
    the answer? Exit 0: no outlier and no finding. 1: outlier records or findings listed. 2: bad input.
    """
    from ..scan.runner import scan as run_scan

    out = Path(output) if output is not None else default_output(dataset_dir)

    def body():  # type: ignore[no-untyped-def]
        if scheduler is not None and "://" not in scheduler:
            raise ForensicsError(f"--scheduler takes a Dask address like tcp://HOST:PORT, got {scheduler!r}")
        if target is None and (served_prompts is not None or served_len is not None):
            raise ForensicsError("--served-prompts and --served-len compare the training data with the served side: "
                                 "give --target too")
        try:
            return run_scan(dataset_dir, reference=reference, output=out, resume=resume, workers=workers,
                            scheduler=scheduler, allow_unsafe=allow_unsafe_pickle, convention=reference_convention,
                            target=target, served_prompts=served_prompts, served_len=served_len,
                            agreement_tokens=agreement_tokens)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (interrupts.Terminated)
            click.echo(f"eagleforensics: {what(exc)}; the records scanned so far are in {printable(out)}: "
                       "run the same command with --resume to continue", err=True)
            sys.exit(exit_code(exc))

    result = run_guarded(body)
    echo_text(json.dumps(result.to_dict(), indent=2) if as_json else result.to_text() + f"\n\nresults: {printable(out)}")
    sys.exit(result.exit_code)
