"""``eagleforensics doctor``: why does the drafter accept less than it should? Every check the inputs allow."""
from __future__ import annotations

import sys

import click

from .common import echo_text, run_guarded

ENGINES = ("sglang", "vllm", "trtllm")


@click.command()
@click.option("--drafter", type=click.Path(), default=None, help="Drafter directory (config.json + safetensors).")
@click.option("--target", type=click.Path(), default=None,
              help="Target model directory (config.json + safetensors shards; only the tensors a check needs are read).")
@click.option("--train", type=click.Path(), default=None, help="A training record, or a directory of them.")
@click.option("--capture", type=click.Path(), default=None,
              help="Hidden states captured from the served target, or a capture set (capture --prompts): replay "
                   "pools it.")
@click.option("--draft-config", type=click.Path(), default=None,
              help="The draft config the engine reads (default: the drafter's config.json).")
@click.option("--engine", type=click.Choice(ENGINES), default=None, help="The serving engine.")
@click.option("--engine-version", default=None, help="Engine version, e.g. 0.5.12.post1 (default: the newest known).")
@click.option("--vllm-runner", type=click.Choice(("v1", "v2")), default=None, help="vLLM model runner.")
@click.option("--model-type", default=None, help="Target model_type for the engine rules (default: the target's).")
@click.option("--log", type=click.Path(), default=None, help="The server's log (its arguments line and statistics).")
@click.option("--served-len", type=click.IntRange(min=1), default=None,
              help="The longest context the server serves, in tokens (max_model_len / context_length).")
@click.option("--served-prompts", type=click.Path(), default=None,
              help="JSONL of served requests (messages + chat_template_kwargs, prompt text, or token ids), "
                   "to compare the training records' template and thinking mode with.")
@click.option("--capture-convention", type=click.Choice(("hf", "vllm", "sglang", "trtllm")), default="hf",
              show_default=True, help="What the integers in the capture mean.")
@click.option("--max-records", type=click.IntRange(min=1), default=64, show_default=True,
              help="With --train DIR: read at most this many records.")
@click.option("--skip", "skip", multiple=True, metavar="CHECK",
              help="Leave this check out (repeat, or comma-separated; names as in the checks table: sizes, "
                   "vocab-coverage, data-origin, wiring, replay, ...); its row says skipped.")
@click.option("--only", "only", multiple=True, metavar="CHECK",
              help="Run only these checks (repeat, or comma-separated); the others' rows say skipped.")
@click.option("--device", type=click.Choice(("cpu", "cuda")), default="cpu", show_default=True,
              help="Where replay and the target's lm_head products run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="Also write an offline HTML report (notebooks/doctor.ipynb, one row per check) to this file.")
@click.option("--title", default=None, help="Title of the --report page (default 'Doctor: <first input>').")
@click.option("--allow-unsafe-pickle", is_flag=True,
              help="Allow full unpickling of .pt files. DANGEROUS: runs any code the file contains; trusted files only.")
def doctor(drafter: str | None, target: str | None, train: str | None, capture: str | None,
           draft_config: str | None, engine: str | None, engine_version: str | None, vllm_runner: str | None,
           model_type: str | None, log: str | None, served_len: int | None, served_prompts: str | None,
           capture_convention: str, max_records: int, skip: tuple[str, ...], only: tuple[str, ...], device: str,
           as_json: bool, report_path: str | None, title: str | None, allow_unsafe_pickle: bool) -> None:
    """Why is acceptance low? Run every check the given artifacts allow, most costly finding first.

    Each check looks for one common cause (vocabulary map, embedding, sizes, flags an engine ignores,
    RoPE and context length, launch arguments, training data, the aux-layer wiring) and says what to
    do and the source it rests on; checks whose inputs are missing are listed with the option that
    would enable them.

    With --report OUT.html the same checks run in notebooks/doctor.ipynb (papermill -> nbconvert,
    one offline page); the verdict, what to do and the page's path are printed (--json: the object).

    --skip CHECK / --only CHECK leave checks out by the names of the checks table (an unknown name is
    bad input); --device cuda runs replay and the target's lm_head products on the GPU.

    Exit 0: nothing found (OK). 1: something to change (ACTION) or broken (PROBLEM). 2: bad input.
    3: the report notebook crashed.
    """
    from ..checks.base import DoctorInputs
    from ..doctor import diagnose

    inputs = DoctorInputs(drafter=drafter, target=target, train=train, capture=capture, draft_config=draft_config,
                          engine=engine, engine_version=engine_version, vllm_runner=vllm_runner,
                          model_type=model_type, log=log, served_len=served_len, served_prompts=served_prompts,
                          capture_convention=capture_convention, max_records=max_records,
                          allow_unsafe=allow_unsafe_pickle, skip=_names(skip), only=_names(only), device=device)
    if report_path is not None:
        import json
        from pathlib import Path

        from ..errors import printable
        from ..report.doctorreport import build_doctor_report

        outcome = run_guarded(lambda: build_doctor_report(inputs, Path(report_path), title=title))
        if as_json:
            echo_text(json.dumps({k: v for k, v in outcome.summary.items() if k != "parameters"}, indent=2,
                                 allow_nan=False, default=str))
        else:
            echo_text(f"VERDICT: {outcome.verdict}")
            for item in outcome.summary.get("todo", []):
                echo_text(f"  - {item}")
            echo_text(f"report: {printable(outcome.html)}")
        sys.exit(outcome.exit_code)
    report = run_guarded(lambda: diagnose(inputs))
    echo_text(report.to_json() if as_json else report.to_text())
    sys.exit(report.exit_code)


def _names(values: tuple[str, ...]) -> tuple[str, ...]:
    """--skip a --skip b and --skip a,b alike: the names, in order, once each."""
    return tuple(dict.fromkeys(n.strip() for v in values for n in v.split(",") if n.strip()))
