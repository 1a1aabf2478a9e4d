"""Serving-side rules as data: what each engine release does with penalties, LoRA, DP attention and T > 0 verification.

The facts the serving checks (``checks.penalty``, ``checks.lora``, ``checks.dpattention``) and
plan's suspects (``engines.suspects``) apply, each row citing the released wheels it was read
from (``pip download --no-deps sglang==X vllm==Y``, unzipped, argument names, defaults and the
code paths grepped). Releases read: SGLang 0.4.6, 0.5.5 - 0.5.12, 0.5.23; vLLM 0.10.0, 0.10.1.1,
0.10.2, 0.11.0, 0.12.0, 0.13.0, 0.14.0, 0.17.0, 0.20.0 - 0.25.0, 0.29.0, 0.33.0, 0.34.0. A row holds from
``since`` to ``until`` (the last release read where it holds; None: to the newest known); a
release between two rows takes the earlier row.

Topics:

* ``penalty``: repetition / frequency / presence penalties under speculative decoding.
  ``target-only``: the verify step penalises the target's logits while the drafter proposes from
  its own unpenalised logits, so the two disagree more the stronger the penalty;
  ``not-speculated``: a request with a penalty is left out of speculation (no drafts for it).
* ``generation-config``: whether the server applies the target's ``generation_config.json``
  sampling values (its ``repetition_penalty`` among them) to requests that do not set them, and
  the argument that turns it off.
* ``lora``: LoRA adapters on the target with a speculative drafter.
* ``dp-attention``: which group the aux hidden states are gathered over under DP attention.
* ``verify``: the acceptance rule at temperature > 0 and the arguments that change it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .launchrules import engine_name
from .rules import NEWEST, family_of, parse_version, release_span, row_at

TOPICS = ("penalty", "generation-config", "lora", "dp-attention", "verify")


@dataclass(frozen=True)
class ServingRule:
    """What ``engine`` does on ``topic`` from ``since`` on (``families`` empty: every family)."""

    topic: str
    engine: str
    since: str
    until: str | None
    outcome: str
    detail: str
    source: str
    families: tuple[str, ...] = ()
    setting: str = ""  # the argument that changes the outcome, with its default
    keys: tuple[str, ...] = ()  # generation-config: the penalties the engine takes from generation_config.json

    def span(self) -> str:
        return release_span(self.since, self.until)


_SGL = "sglang {v} python/sglang/srt/{f}"
_VLLM = "vllm {v} vllm/{f}"

SERVING_RULES: tuple[ServingRule, ...] = (
    # ---------------------------------------------------------------- penalties
    ServingRule("penalty", "sglang", "0.4.6", None, "target-only",
                "the verify step adds the accumulated frequency/presence penalties and scales by the repetition "
                "penalty on the target's logits (a 'relaxed version of penalties for speculative decoding': "
                "the penalty state is updated once per verify round and the same penalty is repeated over "
                "every draft position), while the draft's top-k is taken from its own unpenalised "
                "probabilities",
                _SGL.format(v="0.4.6", f="speculative/eagle_utils.py") + " verify, eagle_worker.py draft; "
                + _SGL.format(v="0.5.5 - 0.5.12", f="speculative/eagle_info.py") + " verify; "
                + _SGL.format(v="0.5.23", f="speculative/eagle_utils.py") + " (acc_additive_penalties, "
                "acc_scaling_penalties); no penalty in the draft path of any release read"),
    ServingRule("penalty", "vllm", "0.10.0", "0.13.0", "not-speculated",
                "a request with a frequency, presence or repetition penalty (or min_p, or logprobs) is put in "
                "spec_decode_unsupported_reqs and gets no draft tokens: it runs without speculation, so it "
                "gains nothing from the drafter (the acceptance metrics count only drafted requests)",
                _VLLM.format(v="0.10.0 - 0.13.0", f="v1/spec_decode/utils.py") + " is_spec_decode_unsupported; "
                "v1/worker/gpu_input_batch.py (read 0.10.0, 0.10.1.1, 0.10.2, 0.11.0, 0.12.0, 0.13.0)"),
    ServingRule("penalty", "vllm", "0.14.0", None, "target-only",
                "the rejection sampler applies the penalties to the target's logits at every draft position "
                "(apply_penalties, with the draft tokens counted as output), while the EAGLE proposer drafts "
                "from unpenalised logits",
                _VLLM.format(v="0.14.0 - 0.33.0", f="v1/sample/rejection_sampler.py") + " apply_penalties; "
                "v1/spec_decode/eagle.py has no penalty (read 0.14.0, 0.17.0, 0.20.0, 0.25.0, 0.29.0, 0.33.0); "
                "is_spec_decode_unsupported gone from 0.14.0; "
                + _VLLM.format(v="0.34.0", f="v1/worker/gpu/spec_decode/rejection_sampler.py") + " (V1's file is "
                "gone: the V2 verify runs the target sampler's apply_sampling_params, penalties among its logits "
                "processors, v1/worker/gpu/sample/penalties.py, at every draft position; no penalty in "
                "v1/worker/gpu/spec_decode/autoregressive/speculator.py)"),
    # ---------------------------------------------------------------- generation_config.json defaults
    ServingRule("generation-config", "sglang", "0.4.6", "0.4.6", "ignored",
                "no sampling_defaults argument: requests get SGLang's neutral defaults",
                _SGL.format(v="0.4.6", f="server_args.py") + " (no sampling_defaults field)"),
    ServingRule("generation-config", "sglang", "0.5.5", None, "applied",
                "sampling_defaults='model' (the default) takes repetition_penalty, temperature, top_k, top_p and "
                "min_p from the target's generation_config.json for every request that does not set them; "
                "'openai' keeps the neutral defaults",
                _SGL.format(v="0.5.5, 0.5.12", f="server_args.py") + " sampling_defaults = 'model'; "
                + _SGL.format(v="0.5.5, 0.5.23", f="configs/model_config.py") + " get_default_sampling_params; "
                "0.5.23 arg_groups/fields/serving.py (releases between 0.4.6 and 0.5.5 not read)",
                setting="sampling_defaults='model'", keys=("repetition_penalty",)),
    ServingRule("generation-config", "vllm", "0.10.0", "0.29.0", "applied",
                "generation_config='auto' (the default) takes repetition_penalty, temperature, top_k, top_p, "
                "min_p and max_new_tokens from the target's generation_config.json as every request's defaults; "
                "'vllm' keeps vLLM's neutral defaults; override_generation_config overrides single values",
                _VLLM.format(v="0.10.0", f="config.py") + " ModelConfig.get_diff_sampling_param; "
                + _VLLM.format(v="0.14.0 - 0.29.0", f="config/model.py"),
                setting="generation_config='auto'", keys=("repetition_penalty",)),
    ServingRule("generation-config", "vllm", "0.33.0", None, "applied",
                "as before, and the frequency and presence penalties too",
                _VLLM.format(v="0.33.0, 0.34.0", f="config/model.py") + " get_diff_sampling_param (0.30 - 0.32 not "
                "read)",
                setting="generation_config='auto'",
                keys=("repetition_penalty", "presence_penalty", "frequency_penalty")),
    # ---------------------------------------------------------------- LoRA
    ServingRule("lora", "sglang", "0.4.6", "0.4.6", "target-only",
                "LoRA adapters wrap the target's layers only (and need --disable-cuda-graph and "
                "--disable-radix-cache in this release); the EAGLE draft worker loads no adapter",
                _SGL.format(v="0.4.6", f="server_args.py") + " check_server_args (lora_paths needs "
                "disable_cuda_graph and disable_radix_cache); no LoRA in speculative/"),
    ServingRule("lora", "sglang", "0.5.5", None, "target-only",
                "enable_lora / lora_paths wrap the target's layers; the EAGLE draft worker builds no LoRA layers "
                "(0.5.23 unwraps the target's LoRA-wrapped lm_head to share the base weights with the draft), "
                "so the drafter keeps predicting the base model while the adapted target verifies",
                _SGL.format(v="0.5.5, 0.5.12", f="server_args.py") + " enable_lora / lora_paths; "
                + _SGL.format(v="0.5.23", f="speculative/eagle_worker_v2.py") + " unwrap_lora_layer; "
                "arg_groups/fields/lora.py"),
    ServingRule("lora", "vllm", "0.10.0", None, "target-only",
                "--enable-lora with --lora-modules applies the adapter a request names to the target model "
                "only; the EAGLE proposer has no LoRA path",
                _VLLM.format(v="0.10.0, 0.20.0, 0.33.0", f="v1/spec_decode/eagle.py") + " (no LoRA); "
                "engine/arg_utils.py enable_lora, lora_modules (entrypoints/openai/cli_args.py); "
                + _VLLM.format(v="0.34.0", f="v1/worker/gpu/spec_decode/eagle/utils.py") + " (V1's eagle.py is "
                "gone; the drafter takes the base embedding under the target's LoRA wrapper, no adapter)"),
    # ---------------------------------------------------------------- DP attention: the aux gather group
    ServingRule("dp-attention", "sglang", "0.5.7", "0.5.9", "wrong-group",
                "with an all-to-all MoE backend (moe_a2a_backend deepep or mooncake) the aux states of "
                "layers past first_k_dense_replace are all-gathered over the whole tensor-parallel group "
                "(tensor_model_parallel_all_gather) instead of the attention-TP group; under DP attention the "
                "two differ, so the drafter is fed other ranks' tokens' states",
                _SGL.format(v="0.5.7, 0.5.8, 0.5.9", f="models/deepseek_v2.py") + " DeepseekV2Model.forward; "
                "fixed by sgl-project/sglang#20492", families=("deepseek",),
                setting="moe_a2a_backend in (deepep, mooncake) with enable_dp_attention"),
    ServingRule("dp-attention", "sglang", "0.5.10", None, "right-group",
                "the aux states are gathered over the attention-TP group (get_attention_tp_group().all_gather)",
                _SGL.format(v="0.5.10 - 0.5.12", f="models/deepseek_v2.py") + "; 0.5.23 layers/"
                "aux_hidden_states.py AuxHiddenStatePacker", families=("deepseek",)),
    # ---------------------------------------------------------------- verification at temperature > 0
    ServingRule("verify", "sglang", "0.4.6", "0.5.12", "target-only",
                "drafts are the draft's top-k (greedy); at temperature > 0 verification samples from the target "
                "with the drafts taken as certain (tree_speculative_sampling_target_only: a draft token is kept "
                "with the target's probability of it, speculative_accept_threshold_single / _acc 1.0); on "
                "platforms without the kernel (TREE_SPEC_KERNEL_AVAILABLE false: not CUDA) verification falls "
                "back to greedy",
                _SGL.format(v="0.4.6", f="speculative/eagle_utils.py") + "; " +
                _SGL.format(v="0.5.5, 0.5.12", f="speculative/eagle_info.py") + " verify",
                setting="speculative_accept_threshold_single=1.0, speculative_accept_threshold_acc=1.0"),
    ServingRule("verify", "sglang", "0.5.23", None, "target-only",
                "as before by default; speculative_use_rejection_sampling (topk 1, default False) uses the "
                "draft's probabilities (min(1, p/q)); CPU, XPU and HIP without it verify greedily",
                _SGL.format(v="0.5.23", f="speculative/eagle_utils.py") + " _verify_uses_greedy; "
                "arg_groups/fields/spec.py (releases 0.5.13 - 0.5.22 not read)",
                setting="speculative_use_rejection_sampling=False"),
    ServingRule("verify", "vllm", "0.10.0", "0.17.0", "target-only",
                "EAGLE drafts are greedy and the rejection sampler gets no draft probabilities (one-hot: a "
                "draft token is kept with the target's probability of it)",
                _VLLM.format(v="0.10.0, 0.17.0", f="v1/worker/gpu_model_runner.py") + " (draft_probs None); "
                "v1/sample/rejection_sampler.py NO_DRAFT_PROBS; the choice: vllm-project/vllm#16899"),
    ServingRule("verify", "vllm", "0.20.0", "0.20.0", "strict",
                "rejection_sample_method 'strict' by default: a draft token is kept only when it equals the "
                "target's sampled token; 'probabilistic' keeps the draft logits for the ratio test",
                _VLLM.format(v="0.20.0", f="config/speculative.py") + " rejection_sample_method "
                "(0.18, 0.19 not read)", setting="rejection_sample_method='strict'"),
    ServingRule("verify", "vllm", "0.21.0", None, "target-only",
                "draft_sample_method 'greedy' by default (drafts are argmax, treated as one-hot in the ratio "
                "test); 'gumbel' (0.21 - 0.24) / 'probabilistic' (0.25 on) samples drafts and keeps their "
                "probabilities; rejection_sample_method 'standard' ('synthetic' accepts at configured rates, "
                "a benchmark mode; 0.33 adds 'block' and the lossy 'fly')",
                _VLLM.format(v="0.21.0 - 0.33.0, 0.34.0", f="config/speculative.py") + " draft_sample_method, "
                "rejection_sample_method", setting="draft_sample_method='greedy'"),
)


def _rows(topic: str, engine: str, model_type: str | None) -> list[ServingRule]:
    if topic not in TOPICS:
        raise ValueError(f"unknown serving topic {topic!r}")
    eng = engine_name(engine)
    fam = family_of(model_type) if model_type else None
    return [r for r in SERVING_RULES if r.topic == topic and r.engine == eng
            and (not r.families or (fam is not None and fam in r.families))]


def serving_rule(topic: str, engine: str, version: str | None = None,
                 model_type: str | None = None) -> ServingRule | None:
    """The row for ``topic`` on ``engine`` at ``version`` (None: the newest known); None before any row or when
    the rows are for other families (a family-bound row needs ``model_type``)."""
    rows = _rows(topic, engine, model_type)
    return row_at(rows, str(parse_version(version or NEWEST[engine_name(engine)])), until=False)


def rules_between(topic: str, engine: str, first: str, last: str | None,
                  model_type: str | None = None) -> list[ServingRule]:
    """Every row that holds somewhere in releases ``first`` .. ``last`` (None: the newest known), oldest first:
    what a log whose exact release is unknown may be running."""
    rows = sorted(_rows(topic, engine, model_type), key=lambda r: parse_version(r.since))
    lo, hi = parse_version(first), parse_version(last or NEWEST[engine_name(engine)])
    out = []
    for i, r in enumerate(rows):
        end = parse_version(rows[i + 1].since) if i + 1 < len(rows) else None
        if parse_version(r.since) <= hi and (end is None or end > lo):
            out.append(r)
    return out


def describe_rules(topic: str | None = None) -> list[dict[str, object]]:
    """The rows (of one topic) as records, for docs and tests."""
    return [{"topic": r.topic, "engine": r.engine, "since": r.since, "until": r.until, "outcome": r.outcome,
             "families": list(r.families), "setting": r.setting, "source": r.source}
            for r in SERVING_RULES if topic is None or r.topic == topic]


def spans(rows: Sequence[ServingRule]) -> str:
    """``sglang 0.5.7 - 0.5.9`` for each row, joined."""
    return ", ".join(f"{r.engine} {r.span()}" for r in rows)
