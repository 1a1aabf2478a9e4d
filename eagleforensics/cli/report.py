"""``eagleforensics report SHARD CAPTURE -o report.html``: run the align notebook, write one self-contained HTML file."""
from __future__ import annotations

import sys

import click

from ..errors import printable
from .common import echo_text, run_guarded

CAPTURE_CONVENTIONS = ("hf", "vllm", "sglang", "trtllm")
ENGINES = ("sglang", "vllm", "trtllm")


@click.command()
@click.argument("shard", type=click.Path())
@click.argument("capture", type=click.Path())
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), default=None,
              help="HTML file to write. Default: reports/align-<shard>.html under the current directory.")
@click.option("--capture-convention", type=click.Choice(CAPTURE_CONVENTIONS), default="hf", show_default=True,
              help="What the integers in the capture mean (hf: output_hidden_states index).")
@click.option("--engine", type=click.Choice(ENGINES), default=None,
              help="Check what this engine will capture against the training data and advise on its ids "
                   "(engine default if no --draft-config); default: advise on all, no serving check.")
@click.option("--draft-config", type=click.Path(), default=None,
              help="Draft config.json (or its directory), or a TensorRT-LLM YAML; needs --engine.")
@click.option("--engine-version", default=None, help="Engine version, e.g. 0.5.12 (SGLang DeepSeek rules depend on it).")
@click.option("--model-type", default=None, help="Target model_type for the engine rule (llama, qwen3, deepseek_v3, ...).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="Compare at most this many tokens.")
@click.option("--device", type=click.Choice(("cpu", "cuda", "auto")), default="auto", show_default=True,
              help="Where the scoring runs, as align --device; auto = cuda when a GPU is visible.")
@click.option("--no-hash", is_flag=True, help="Do not hash the inputs for the provenance block (huge files).")
@click.option("--redact-paths", is_flag=True, help="Show input file names only, no directories.")
@click.option("--title", default=None, help="Report title; default '<shard> vs <capture>'.")
@click.option("--drafter", type=click.Path(), default=None,
              help="EAGLE-3 drafter directory: add a Replay section (accept length per wiring, trained one highlighted).")
@click.option("--target", type=click.Path(), default=None,
              help="Target model directory for the replay (its lm_head and, if the drafter lacks it, embedding).")
@click.option("--with-input", is_flag=True, help="Keep the notebook's code cells in the HTML (default: outputs only).")
@click.option("--keep-notebook", is_flag=True, help="Also write the executed notebook beside the HTML (.ipynb).")
def report(shard: str, capture: str, output: str | None, capture_convention: str, engine: str | None,
           draft_config: str | None, engine_version: str | None, model_type: str | None, max_tokens: int | None,
           device: str, title: str | None, drafter: str | None, target: str | None, with_input: bool,
           keep_notebook: bool, no_hash: bool, redact_paths: bool) -> None:
    """Execute notebooks/align.ipynb on SHARD and CAPTURE (papermill) and write one offline HTML report.

    The page embeds plotly.js and loads nothing from the network. With --engine it has a Serving
    section: what that engine will capture for --draft-config against what SHARD holds, and the
    ids to write. Exit 0: verdict OK (served as trained). 1: ACTION (ids to write) or PROBLEM
    (a slot unplaced, a miswiring). 2: bad input. 3: the notebook crashed.
    """
    from pathlib import Path

    from ..report.pipeline import build_report

    ctx = click.get_current_context()
    command = ["eagleforensics", "report", str(Path(shard).absolute()), str(Path(capture).absolute())]
    for name, value in ctx.params.items():
        if name in ("shard", "capture") or value in (None, False) or value == ctx.command.params[
                [p.name for p in ctx.command.params].index(name)].default:
            continue
        flag = "--" + name.replace("_", "-")
        if name in ("output", "draft_config", "drafter", "target"):
            value = str(Path(value).absolute())
        command += [flag] if value is True else [flag, str(value)]
    outcome = run_guarded(lambda: build_report(
        shard, capture, output, capture_convention=capture_convention, engine=engine, max_tokens=max_tokens,
        device=device, title=title, draft_config=draft_config, engine_version=engine_version,
        model_type=model_type, with_input=with_input, keep_notebook=keep_notebook, strict=True,
        hash_inputs=not no_hash, redact_paths=redact_paths, command=command, drafter=drafter, target=target))
    echo_text(f"VERDICT: {outcome.verdict}")
    for action in outcome.summary.get("actions", []):  # the snippet each engine needs, as in align's text
        echo_text(f"  {action['engine']}: " + " | ".join((action["snippet"] or "").splitlines()))
    for item in outcome.summary.get("todo", []):
        echo_text(f"  - {item}")
    echo_text(f"report: {printable(outcome.html)}")
    if outcome.notebook is not None:
        echo_text(f"notebook: {printable(outcome.notebook)}")
    sys.exit(outcome.exit_code)
