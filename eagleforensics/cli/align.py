"""``eagleforensics align TRAIN CAPTURE``: place each training slot, print a table or JSON."""
from __future__ import annotations

import sys

import click

from .common import echo_text, rule_options, run_guarded

TRAIN_FORMATS = ("specforge", "speculators", "modelopt", "eagle", "list", "generic")
CAPTURE_CONVENTIONS = ("hf", "vllm", "sglang", "trtllm")
ENGINES = ("sglang", "vllm", "trtllm")


@click.command()
@click.argument("train", type=click.Path())
@click.argument("capture", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(TRAIN_FORMATS), default=None,
              help="Training layout; detected from content when omitted.")
@click.option("--capture-convention", type=click.Choice(CAPTURE_CONVENTIONS), default="hf", show_default=True,
              help="What the integers in the capture mean (hf: output_hidden_states index).")
@click.option("--num-layers", type=click.IntRange(min=1), default=None, help="N, when the capture cannot tell.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="Compare at most this many tokens.")
@click.option("--min-score", type=click.FloatRange(0, 1), default=None,
              help="Lower (or raise) the score a match needs, e.g. for engine-vs-HF drift in deep layers.")
@click.option("--min-margin", type=click.FloatRange(0, 1), default=None, help="Override the margin a match needs.")
@click.option("--draft-config", type=click.Path(), default=None,
              help="Draft config.json (or its directory), or a TensorRT-LLM YAML; needs --engine.")
@click.option("--engine", type=click.Choice(ENGINES), default=None,
              help="Check what this engine will capture against the training data (engine default if no --draft-config).")
@rule_options
@click.option("--device", type=click.Choice(("cpu", "cuda", "auto")), default="cpu", show_default=True,
              help="Where the per-position reduction runs; auto = cuda when a GPU is visible.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--allow-unsafe-pickle", is_flag=True,
              help="Allow full unpickling of .pt files. DANGEROUS: runs any code the file contains; trusted files only.")
def align(train: str, capture: str, fmt: str | None, capture_convention: str, num_layers: int | None,
          max_tokens: int | None, min_score: float | None, min_margin: float | None, draft_config: str | None,
          engine: str | None, engine_version: str | None, vllm_runner: str | None, model_type: str | None,
          device: str, as_json: bool, allow_unsafe_pickle: bool) -> None:
    """Say which residual-stream position each slot of TRAIN holds, judged against the CAPTURE sweep.

    With --engine, also say whether the states that engine will capture for the drafter (per
    --draft-config, or its default when none is given) equal what TRAIN holds, and the ids to write.

    Exit 0: every slot placed confidently (and served as trained). 1: a slot unplaced, a miswiring
    found, or the engine will not serve what was trained. 2: bad input.
    """
    from ..alignment import align as run_align

    result = run_guarded(lambda: run_align(
        train, capture, fmt=fmt, convention=capture_convention, num_layers=num_layers,
        max_tokens=max_tokens, allow_unsafe=allow_unsafe_pickle, min_score=min_score, min_margin=min_margin,
        draft_config=draft_config, engine=engine, engine_version=engine_version, model_type=model_type,
        device=device, vllm_runner=vllm_runner))
    echo_text(result.to_json() if as_json else result.to_text())
    sys.exit(result.exit_code)
