"""``eagleforensics replay DRAFTER CAPTURE``: run the drafter offline on each wiring, print acceptance per wiring."""
from __future__ import annotations

import sys

import click

from ..io.served import SERVED_FEATURES
from .common import echo_text, run_guarded

ENGINES = ("sglang", "vllm", "trtllm")
CAPTURE_CONVENTIONS = ("hf", "vllm", "sglang", "trtllm")


@click.command()
@click.argument("drafter", type=click.Path())
@click.argument("capture", type=click.Path())
@click.option("--train", "train", type=click.Path(), default=None,
              help="Training record: its aux positions (found by align) are replayed as the trained wiring.")
@click.option("--target", type=click.Path(), default=None,
              help="Target model directory: its lm_head gives the target's next tokens, its embedding stands in "
                   "when the drafter has none (only those tensors are read from the safetensors shards).")
@click.option("--wiring", "wirings", multiple=True,
              help="Extra wiring to replay, e.g. p3,p7,p10 (positions, in fc order); repeatable.")
@click.option("--steps", type=click.IntRange(1, 16), default=3, show_default=True, help="Draft steps per chain (SGLang's common --speculative-num-steps).")
@click.option("--cost-ratio", type=float, default=0.05, show_default=True,
              help="Cost of one draft step relative to one target verify pass, for the speed-up column.")
@click.option("--engine", type=click.Choice(ENGINES), default=None,
              help="Also replay the wiring this engine would feed, reading --draft-config (default: DRAFTER/config.json).")
@click.option("--draft-config", type=click.Path(), default=None, help="Draft config.json or TRT-LLM YAML; needs --engine.")
@click.option("--engine-version", default=None, help="Engine version, e.g. 0.5.12.")
@click.option("--model-type", default=None, help="Target model_type for the engine rule (llama, deepseek_v3, ...).")
@click.option("--vllm-runner", type=click.Choice(("v1", "v2")), default=None,
              help="vLLM's model runner, whose reading of the ids differs (--engine vllm only; default: the release's).")
@click.option("--capture-convention", type=click.Choice(CAPTURE_CONVENTIONS), default="hf", show_default=True,
              help="What the integers in the capture mean.")
@click.option("--max-tokens", type=click.IntRange(min=2), default=None, help="Replay at most this many capture rows.")
@click.option("--temperature", type=click.FloatRange(0, 100), default=0.0, show_default=True,
              help="Also give the expected acceptance when the server samples at this temperature (needs --target): "
                   "greedy drafts verified by sampling (SGLang's default) and drafts sampled from the drafter "
                   "(rejection sampling).")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
              help="Top-p the target's distribution is renormalised to at --temperature.")
@click.option("--topk", type=click.IntRange(1, 16), default=1, show_default=True,
              help="SGLang's --speculative-eagle-topk: > 1 adds the accept length of its EAGLE tree.")
@click.option("--draft-tokens", type=click.IntRange(min=2), default=None,
              help="SGLang's --speculative-num-draft-tokens (the tree's verified nodes + 1); needs --topk > 1.")
@click.option("--served-without", "served_without", multiple=True, type=click.Choice(list(SERVED_FEATURES)),
              help="Add a row replaying the drafter as an engine that ignores this feature serves it; repeatable.")
@click.option("--device", type=click.Choice(("cpu", "cuda")), default="cpu", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--profile", "profile_out", type=click.Path(), default=None,
              help="Also write the trained (else best) wiring's per-position acceptance as ModelOpt's "
                   "speculation_profile.json (docs/replay.md).")
@click.option("--allow-unsafe-pickle", is_flag=True,
              help="Allow full unpickling of .pt files. DANGEROUS: runs any code the file contains; trusted files only.")
def replay(drafter: str, capture: str, train: str | None, target: str | None, wirings: tuple[str, ...], steps: int,
           cost_ratio: float, engine: str | None, draft_config: str | None, engine_version: str | None,
           model_type: str | None, vllm_runner: str | None, capture_convention: str, max_tokens: int | None, temperature: float, top_p: float,
           topk: int, draft_tokens: int | None, served_without: tuple[str, ...], device: str, as_json: bool,
           profile_out: str | None, allow_unsafe_pickle: bool) -> None:
    """Predict the acceptance each wiring would give: run DRAFTER on CAPTURE's states, compare with the target's tokens.

    Wirings replayed: the trained one (with --train), the engines' default [2, N//2, N-3], what --engine
    reads from the draft config, and every --wiring. Per wiring: per-step acceptance, the accept length
    of a chain of --steps drafts (1 + expected accepted drafts) and the speed-up L / (1 + steps * cost_ratio).
    With a training record that has a loss mask (--train, or a record given as CAPTURE: its own aux
    states are replayed), only supervised rows count, as SpecForge counts acc_k; --train also lends its
    token ids to a capture that has none.

    CAPTURE may be a capture set (the directory capture --prompts writes): every sequence is replayed and
    acc_k pooled over them, with each sequence's counts; --train DIR then pairs each capture with the
    record whose token ids hold its sequence.

    Exit 0: measured (and, with --engine, the engine feeds the trained wiring). 1: the engine would feed
    another wiring. 2: bad input.
    """
    from ..io.captureset import list_capture_set
    from ..replay import run_replay

    if list_capture_set(capture) is not None:  # a capture set (capture --prompts): every sequence, pooled
        from ..replaypool import run_pooled

        pooled = run_guarded(lambda: run_pooled(
            drafter, capture, train=train, steps=steps, allow_unsafe=allow_unsafe_pickle, convention=capture_convention,
            target=target, wirings=list(wirings), cost_ratio=cost_ratio, engine=engine, draft_config=draft_config,
            engine_version=engine_version, model_type=model_type, device=device, max_tokens=max_tokens,
            temperature=temperature, top_p=top_p, topk=topk, draft_tokens=draft_tokens,
            served_without=served_without))
        echo_text(pooled.to_json() if as_json else pooled.to_text())
        sys.exit(pooled.exit_code)
    result = run_guarded(lambda: run_replay(
        drafter, capture, target=target, train=train, wirings=list(wirings), steps=steps, cost_ratio=cost_ratio,
        engine=engine, draft_config=draft_config, engine_version=engine_version, model_type=model_type,
        device=device, max_tokens=max_tokens, convention=capture_convention, allow_unsafe=allow_unsafe_pickle,
        temperature=temperature, top_p=top_p, topk=topk, draft_tokens=draft_tokens, served_without=served_without,
        vllm_runner=vllm_runner))
    if profile_out is not None:
        run_guarded(lambda: write_profile(result, profile_out))
    echo_text(result.to_json() if as_json else result.to_text())
    sys.exit(result.exit_code)


def write_profile(result, path: str) -> None:  # noqa: ANN001
    """Write ``result``'s trained wiring (else its best) as a speculation profile (``io.specprofile``)."""
    import json

    from ..io.atomic import write_bytes_atomic
    from ..io.specprofile import profile_doc

    chosen = result.trained or result.best
    if chosen is None:
        from ..errors import ForensicsError

        raise ForensicsError("replay measured no wiring: no speculation profile to write", path=path)
    doc = profile_doc(chosen.to_dict(result.cost_ratio), result.steps,
                      conditions={"capture": result.capture, "tokens": result.tokens})
    write_bytes_atomic(path, (json.dumps(doc, indent=2) + "\n").encode())
