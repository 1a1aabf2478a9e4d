"""The sourced table behind ``flagrules``: what each engine release does with each drafter feature.

One ``FlagRow`` per (engine, feature, version range, drafter model file, config layout), read
from the released wheels (every SGLang release 0.4.10 - 0.5.23 and vLLM release 0.10.1.1 -
0.33.0 unpacked, boundaries read; vLLM 0.34.0 read for every open row: llama_eagle3.py and qwen3_eagle3.py
only dropped P-EAGLE's mask_hidden, deepseek_eagle3.py and llama.py are unchanged, algos.py's update_eagle3 is
the same); ``source`` names the version and file. Statuses: honoured,
ignored (loads, runs, serves another function than the one trained), refused (error at load),
unknown. Features '*' rows say the engine cannot load that drafter at all.
"""
from __future__ import annotations

from dataclasses import dataclass

from .rules import release_span

STATUSES = ("honoured", "ignored", "refused", "unknown")
LAYOUTS = ("flat", "speculators")  # flat: SpecForge/ModelOpt/EAGLE config.json; speculators: nested
ARCHS = ("llama", "qwen3", "deepseek")  # which drafter model file an engine builds


@dataclass(frozen=True)
class FlagRow:
    """What one engine does with one drafter feature from ``since`` to ``until`` (inclusive).

    ``arch``: the drafter model file (llama / qwen3 / deepseek; None: every file);
    ``layout``: flat or speculators config (None: both); ``runner``: vLLM v1 / v2 (None: both).
    ``feature`` '*' covers every feature (the engine cannot load the drafter at all).
    """

    engine: str
    feature: str
    since: str
    until: str | None
    status: str
    consequence: str
    source: str
    arch: str | None = None
    layout: str | None = None
    runner: str | None = None

    @property
    def label(self) -> str:
        span = release_span(self.since, self.until)
        where = "/".join(x for x in (self.arch, self.layout, self.runner) if x)
        return f"{self.engine} {self.feature} {span}" + (f" ({where})" if where else "")


_S = "sglang {v} srt/models/{f}"
_V = "vllm {v} vllm/model_executor/models/{f}"
_ALGOS = "vllm {v} vllm/transformers_utils/configs/speculators/algos.py update_eagle3"
_KEYERR = ("load fails: the tensor has no parameter in the drafter (KeyError/ValueError in "
           "load_weights)")
R = FlagRow
FLAG_RULES: tuple[FlagRow, ...] = (
    # ---- SGLang, Llama-arch drafter (srt/models/llama_eagle3.py) ----
    R("sglang", "*", "0.4.10", None, "refused", "SGLang has no loader for the speculators layout "
      "(architectures Eagle3Speculator, nested transformer_layer_config): start-up fails",
      "sglang 0.4.10 - 0.5.23 srt/models/registry.py: no Eagle3Speculator model class, and "
      "no 'speculators' anywhere in the package", layout="speculators"),
    R("sglang", "norm_before_fc", "0.4.10", "0.5.16", "ignored", "input_norm.weight is skipped "
      "by load_weights (no such parameter): fc reads the un-normed concatenated states",
      _S.format(v="0.5.16", f="llama_eagle3.py") + " LlamaForCausalLMEagle3.load_weights",
      arch="llama"),
    R("sglang", "norm_before_fc", "0.5.17", None, "honoured", "input_norm applied before fc "
      "(eagle_config.norm_before_fc or top-level norm_before_fc)",
      _S.format(v="0.5.17, 0.5.23", f="llama_eagle3.py") + " LlamaModel.__init__ input_norm",
      arch="llama"),
    R("sglang", "fc_norm", "0.4.10", "0.5.11", "ignored", "fc_norm.i weights are skipped: fc "
      "reads un-normed aux states", _S.format(v="0.5.11", f="llama_eagle3.py") +
      " load_weights (no fc_norm parameter)", arch="llama"),
    R("sglang", "fc_norm", "0.5.12", None, "honoured", "per-state RMSNorm before fc (fc_norm or "
      "legacy use_aux_norm; aux_norm_low/mid/high renamed)",
      _S.format(v="0.5.12", f="llama_eagle3.py") + " LlamaModel.__init__ fc_norm, "
      "legacy_name_map", arch="llama"),
    R("sglang", "norm_output", "0.4.10", "0.5.11", "ignored", "the raw (pre-norm) state is "
      "always fed back; a drafter trained on post-norm feedback drifts from step 2 on",
      _S.format(v="0.5.11", f="llama_eagle3.py") + " LlamaModel.forward returns "
      "[hidden_states_to_aux] (pre-norm)", arch="llama"),
    R("sglang", "norm_output", "0.5.12", None, "honoured", "norm(h) fed back when norm_output is "
      "true (EAGLE-3.1 meaning; a SpecForge <= 0.2.0 config meant something else: "
      "sgl-project/SpecForge#879)", _S.format(v="0.5.12", f="llama_eagle3.py") +
      " LlamaModel.forward: aux = hidden_states_to_logits if self.norm_output", arch="llama"),
    R("sglang", "norm_before_residual", "0.4.10", None, "ignored", "never read: the residual is "
      "the raw fc output, not hidden_norm of it", "sglang 0.4.10 - 0.5.23 srt/: no "
      "'norm_before_residual' in any release; 0.5.23 srt/models/llama_eagle3.py "
      "LlamaDecoderLayer.forward residual = hidden_states", arch="llama"),
    R("sglang", "extra_layers", "0.4.10", "0.5.11", "refused", "ValueError at load: 'EAGLE3 "
      "currently only supports 1 layer'", _S.format(v="0.5.11", f="llama_eagle3.py") +
      " LlamaForCausalLMEagle3.__init__", arch="llama"),
    R("sglang", "extra_layers", "0.5.12", None, "honoured", "every decoder layer built and run",
      _S.format(v="0.5.12", f="llama_eagle3.py") + " LlamaModel.layers", arch="llama"),
    R("sglang", "sliding_window", "0.4.10", None, "ignored", "the draft config's layer_types / "
      "sliding_window are never read: full attention (from 0.5.12 only "
      "--speculative-draft-window-size puts one window on every draft layer)",
      _S.format(v="0.5.12, 0.5.23", f="llama_eagle3.py, llama.py") + " (no sliding_window in "
      "llama.py; get_attention_sliding_window_size reads the server argument)", arch="llama"),
    R("sglang", "qk_norm", "0.4.10", None, "ignored", "q_norm/k_norm weights are skipped "
      "silently: attention runs without them (SGLang has no Qwen3 EAGLE-3 file)",
      _S.format(v="0.5.23", f="llama_eagle3.py") + " load_weights (param_name in params_dict)",
      arch="llama"),
    # ---- SGLang, DeepSeek/Kimi MLA drafter (srt/models/kimi_k25_eagle3.py) ----
    R("sglang", "*", "0.4.10", "0.5.11", "refused", "no Eagle3DeepseekV2ForCausalLM model file: "
      "start-up fails", "sglang 0.5.11 srt/models/: no kimi_k25_eagle3.py (first in 0.5.12)",
      arch="deepseek"),
    R("sglang", "norm_before_fc", "0.5.12", None, "ignored", "input_norm.weight skipped with a "
      "warning ('Eagle3 MLA: skipping unexpected weight')",
      _S.format(v="0.5.23", f="kimi_k25_eagle3.py") + " Eagle3DeepseekV2ForCausalLM.load_weights",
      arch="deepseek"),
    R("sglang", "fc_norm", "0.5.12", "0.5.12", "ignored", "fc_norm weights skipped with a warning",
      _S.format(v="0.5.12", f="kimi_k25_eagle3.py") + " (no fc_norm)", arch="deepseek"),
    R("sglang", "fc_norm", "0.5.13", None, "honoured", "per-state RMSNorm before fc",
      _S.format(v="0.5.13", f="kimi_k25_eagle3.py") + " Eagle3MLAModel.fc_norm", arch="deepseek"),
    R("sglang", "norm_output", "0.5.12", "0.5.12", "ignored", "pre-norm state always fed back",
      _S.format(v="0.5.12", f="kimi_k25_eagle3.py") + " (no norm_output)", arch="deepseek"),
    R("sglang", "norm_output", "0.5.13", None, "honoured", "norm(h) fed back when true",
      _S.format(v="0.5.13", f="kimi_k25_eagle3.py") + " Eagle3MLAModel.forward", arch="deepseek"),
    R("sglang", "norm_before_residual", "0.5.12", None, "ignored", "never read",
      _S.format(v="0.5.23", f="kimi_k25_eagle3.py") + " Eagle3MLADecoderLayer.forward",
      arch="deepseek"),
    R("sglang", "extra_layers", "0.5.12", None, "refused", "ValueError at load: 'EAGLE3 "
      "currently only supports 1 layer'", _S.format(v="0.5.23", f="kimi_k25_eagle3.py") +
      " Eagle3MLAModel.__init__", arch="deepseek"),
    # ---- vLLM, Llama-arch drafter (llama_eagle3.py) ----
    R("vllm", "norm_before_fc", "0.10.1.1", "0.17.1", "refused", "input_norm.weight: " + _KEYERR,
      _V.format(v="0.17.1", f="llama_eagle3.py") + " LlamaModel.load_weights params_dict[name]",
      arch="llama"),
    R("vllm", "norm_before_fc", "0.18.0", None, "honoured", "input_norm applied before fc "
      "(top-level norm_before_fc; eagle_config.norm_before_fc too from 0.22.0)",
      _V.format(v="0.18.0, 0.22.0, 0.34.0", f="llama_eagle3.py") + " LlamaModel.__init__ input_norm",
      arch="llama", layout="flat"),
    R("vllm", "norm_before_fc", "0.18.0", "0.18.1", "ignored", "the speculators config's "
      "norm_before_fc is not passed on, input_norm.weight is dropped (skip_substrs): fc reads "
      "un-normed states", _ALGOS.format(v="0.18.1") + " (no norm_before_fc; added in 0.19.0)",
      arch="llama", layout="speculators"),
    R("vllm", "norm_before_fc", "0.19.0", None, "honoured", "input_norm applied before fc",
      _ALGOS.format(v="0.19.0, 0.34.0") + " passes norm_before_fc", arch="llama", layout="speculators"),
    R("vllm", "fc_norm", "0.10.1.1", "0.21.0", "refused", "fc_norm.i weights: " + _KEYERR,
      _V.format(v="0.21.0", f="llama_eagle3.py") + " (no fc_norm parameter)", arch="llama"),
    R("vllm", "fc_norm", "0.22.0", None, "honoured", "per-state RMSNorm before fc",
      _V.format(v="0.22.0, 0.34.0", f="llama_eagle3.py") + " LlamaModel fc_norm, "
      "Eagle3LlamaForCausalLM.combine_hidden_states", arch="llama", layout="flat"),
    R("vllm", "fc_norm", "0.22.0", "0.24.0", "refused", "the speculators config's fc_norm is not "
      "passed on, so the fc_norm.i weights have no parameter: " + _KEYERR,
      _ALGOS.format(v="0.24.0") + " (fc_norm passed from 0.25.0)", arch="llama",
      layout="speculators"),
    R("vllm", "fc_norm", "0.25.0", None, "honoured", "per-state RMSNorm before fc",
      _ALGOS.format(v="0.25.0, 0.34.0") + " passes fc_norm", arch="llama", layout="speculators"),
    R("vllm", "norm_output", "0.10.1.1", "0.21.0", "ignored", "the pre-norm state is always fed "
      "back", _V.format(v="0.21.0", f="llama_eagle3.py") + " LlamaModel.forward returns "
      "hidden_prenorm", arch="llama"),
    R("vllm", "norm_output", "0.22.0", None, "honoured", "norm(h) fed back when true (EAGLE-3.1 "
      "meaning; see sgl-project/SpecForge#879 for SpecForge <= 0.2.0 configs)",
      _V.format(v="0.22.0, 0.34.0", f="llama_eagle3.py") + " LlamaModel.forward aux_output",
      arch="llama", layout="flat"),
    R("vllm", "norm_output", "0.22.0", "0.24.0", "ignored", "the speculators config's norm_output "
      "is not passed on: pre-norm state fed back", _ALGOS.format(v="0.24.0") +
      " (norm_output passed from 0.25.0)", arch="llama", layout="speculators"),
    R("vllm", "norm_output", "0.25.0", None, "honoured", "norm(h) fed back when true",
      _ALGOS.format(v="0.25.0, 0.34.0") + " passes norm_output", arch="llama", layout="speculators"),
    R("vllm", "norm_before_residual", "0.10.1.1", None, "honoured", "residual = hidden_norm(fc "
      "output) (speculators configs: vLLM assumes true when the key is absent)",
      _V.format(v="0.10.1.1, 0.33.0, 0.34.0", f="llama_eagle3.py") + " LlamaDecoderLayer."
      "_norm_before_residual; " + _ALGOS.format(v="0.10.1.1") + " default True"),
    R("vllm", "extra_layers", "0.10.1.1", "0.11.0", "refused", "layers.1.* weights: " + _KEYERR +
      " (one layer is built)", _V.format(v="0.11.0", f="llama_eagle3.py") + " LlamaModel.layers",
      arch="llama"),
    R("vllm", "extra_layers", "0.11.1", None, "honoured", "num_hidden_layers layers built and run",
      _V.format(v="0.11.1, 0.34.0", f="llama_eagle3.py") + " LlamaModel.layers", arch="llama"),
    R("vllm", "sliding_window", "0.10.1.1", "0.10.1.1", "refused", "IndexError at load: "
      "layer_types is indexed by the target's layer count", "vllm 0.10.1.1 vllm/model_executor/"
      "models/llama.py LlamaAttention layer_types[layer_idx]", arch="llama"),
    R("vllm", "sliding_window", "0.10.2", None, "honoured", "per-layer window from the draft's "
      "layer_types / sliding_window", "vllm 0.10.2, 0.33.0, 0.34.0 vllm/model_executor/models/llama.py "
      "LlamaAttention (effective_layer_idx = layer_idx - target_layer_count)", arch="llama"),
    R("vllm", "qk_norm", "0.10.1.1", None, "refused", "q_norm/k_norm weights: " + _KEYERR +
      " (the Llama file has no q/k norm)", _V.format(v="0.33.0, 0.34.0", f="llama_eagle3.py") +
      " (Llama attention)", arch="llama"),
    # ---- vLLM, Qwen3-arch drafter (qwen3_eagle3.py, from 0.24.0; before: built as Llama) ----
    R("vllm", "norm_before_fc", "0.24.0", None, "honoured", "input_norm applied before fc",
      _V.format(v="0.24.0, 0.34.0", f="qwen3_eagle3.py") + " Qwen3Eagle3Model", arch="qwen3"),
    R("vllm", "fc_norm", "0.24.0", None, "honoured", "per-state RMSNorm before fc",
      _V.format(v="0.24.0, 0.34.0", f="qwen3_eagle3.py") + " Qwen3Eagle3Model fc_norm", arch="qwen3",
      layout="flat"),
    R("vllm", "fc_norm", "0.24.0", "0.24.0", "refused", "fc_norm not passed on for speculators "
      "configs: " + _KEYERR, _ALGOS.format(v="0.24.0"), arch="qwen3", layout="speculators"),
    R("vllm", "fc_norm", "0.25.0", None, "honoured", "per-state RMSNorm before fc",
      _ALGOS.format(v="0.25.0, 0.34.0"), arch="qwen3", layout="speculators"),
    R("vllm", "norm_output", "0.24.0", None, "honoured", "norm(h) fed back when true",
      _V.format(v="0.24.0, 0.34.0", f="qwen3_eagle3.py") + " aux_output", arch="qwen3", layout="flat"),
    R("vllm", "norm_output", "0.24.0", "0.24.0", "ignored", "norm_output not passed on for "
      "speculators configs: pre-norm state fed back", _ALGOS.format(v="0.24.0"), arch="qwen3",
      layout="speculators"),
    R("vllm", "norm_output", "0.25.0", None, "honoured", "norm(h) fed back when true",
      _ALGOS.format(v="0.25.0, 0.34.0"), arch="qwen3", layout="speculators"),
    R("vllm", "extra_layers", "0.24.0", None, "honoured", "every layer built",
      _V.format(v="0.24.0, 0.34.0", f="qwen3_eagle3.py"), arch="qwen3"),
    R("vllm", "sliding_window", "0.24.0", "0.25.1", "ignored", "the draft's layer_types are not "
      "read: full attention (vllm-project/speculators#684)",
      _V.format(v="0.25.1", f="qwen3_eagle3.py") + " Qwen3Eagle3DecoderLayer (no layer_types)",
      arch="qwen3"),
    R("vllm", "sliding_window", "0.26.0", None, "honoured", "per-layer window from layer_types",
      _V.format(v="0.26.0, 0.34.0", f="qwen3_eagle3.py") + " per_layer_sliding_window", arch="qwen3"),
    R("vllm", "qk_norm", "0.24.0", None, "honoured", "Qwen3 attention with q/k norms",
      _V.format(v="0.24.0, 0.34.0", f="qwen3_eagle3.py") + " (Qwen3DecoderLayer); " +
      _ALGOS.format(v="0.24.0") + " maps model_type qwen3 to Eagle3Qwen3ForCausalLM", arch="qwen3"),
    # ---- vLLM, DeepSeek-arch drafter (deepseek_eagle3.py, from 0.18.0) ----
    R("vllm", "*", "0.10.1.1", "0.17.1", "refused", "no Eagle3DeepseekV2ForCausalLM in the model "
      "registry: start-up fails", "vllm 0.17.1 vllm/model_executor/models/registry.py (no "
      "deepseek_eagle3; first in 0.18.0)", arch="deepseek"),
    R("vllm", "norm_before_fc", "0.18.0", "0.24.0", "ignored", "input_norm.weight skipped "
      "silently (name not in params_dict)", _V.format(v="0.18.0, 0.24.0", f="deepseek_eagle3.py")
      + " DeepseekV2Eagle3Model.load_weights", arch="deepseek"),
    R("vllm", "norm_before_fc", "0.25.0", None, "refused", "input_norm.weight: " + _KEYERR,
      _V.format(v="0.25.0, 0.34.0", f="deepseek_eagle3.py") + " load_weights via AutoWeightsLoader",
      arch="deepseek"),
    R("vllm", "fc_norm", "0.18.0", "0.21.0", "ignored", "fc_norm weights skipped silently",
      _V.format(v="0.21.0", f="deepseek_eagle3.py") + " load_weights", arch="deepseek"),
    R("vllm", "fc_norm", "0.22.0", "0.22.1", "ignored", "fc_norm loaded but never applied "
      "(vllm-project/vllm#43482)", _V.format(v="0.22.0", f="deepseek_eagle3.py") +
      " (combine_hidden_states applies it from 0.23.0)", arch="deepseek"),
    R("vllm", "fc_norm", "0.23.0", None, "honoured", "per-state RMSNorm before fc",
      _V.format(v="0.23.0, 0.34.0", f="deepseek_eagle3.py") + " combine_hidden_states", arch="deepseek"),
    R("vllm", "norm_output", "0.18.0", "0.21.0", "ignored", "pre-norm state always fed back",
      _V.format(v="0.21.0", f="deepseek_eagle3.py"), arch="deepseek"),
    R("vllm", "norm_output", "0.22.0", None, "honoured", "norm(h) fed back when true",
      _V.format(v="0.22.0, 0.34.0", f="deepseek_eagle3.py") + " aux_output", arch="deepseek"),
    R("vllm", "norm_before_residual", "0.18.0", None, "honoured", "residual = hidden_norm(fc)",
      _V.format(v="0.18.0, 0.34.0", f="deepseek_eagle3.py"), arch="deepseek"),
    R("vllm", "extra_layers", "0.18.0", None, "honoured", "every layer built",
      _V.format(v="0.18.0, 0.34.0", f="deepseek_eagle3.py"), arch="deepseek"),
)
del R
