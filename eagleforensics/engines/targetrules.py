"""Target rules as data: what each engine release does with a quantized, rotated, hybrid or multimodal target.

Each row cites the released wheel version and file it was read from (``pip download --no-deps``,
unpacked, read; vLLM 0.10.1.1, 0.11.0, 0.11.1 and 0.33.0, SGLang 0.5.23). A version outside the
rows read is ``unknown``: nothing is guessed between releases.

* ``QUANT_RULES``: how an engine quantizes the EAGLE-3 drafter beside a quantized target: with its
  own config (an unquantized drafter stays unquantized), with the target's method, or with the
  launch's ``--quantization`` unless the draft's own is given.
* ``ROTATION_RULES``: whether the engine folds a target's residual rotation (QuaRot / SpinQuant R1)
  into the drafter's fc and embedding at load.
* ``EAGLE3_ARCHS`` / ``NO_EAGLE3_ARCHS``: per engine, the hybrid (Mamba / linear-attention) and
  multimodal target architectures whose model class implements EAGLE-3's aux-state capture, and
  those whose class does not (the engine raises at start when EAGLE-3 is asked for). Read from the
  model classes of the wheel: vLLM ``SupportsEagle3`` in the class's bases
  (``vllm/model_executor/models/*.py``; ``v1/worker/gpu_model_runner.py``
  ``_setup_eagle3_aux_hidden_state_outputs`` raises "Model does not support EAGLE3 interface"),
  SGLang a ``set_eagle3_layers_to_capture`` method on the class or a base (``srt/models/*.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

from .rules import row_at

_V = "vllm {v} vllm/model_executor/models/{f}"
_S = "sglang {v} sglang/srt/{f}"


@dataclass(frozen=True)
class QuantRule:
    """How the engine builds the drafter's layers beside a quantized target, from ``since`` to ``until``."""

    engine: str
    since: str
    until: str | None
    effect: str  # own (the drafter's config decides) | target (the target's method) | launch (--quantization)
    text: str
    source: str


QUANT_RULES: tuple[QuantRule, ...] = (
    QuantRule("vllm", "0.10.1.1", "0.10.1.1", "own", "the drafter's decoder layer is built without a "
              "quantization config, so it runs in its own dtype", _V.format(v="0.10.1.1", f="llama_eagle3.py")
              + " LlamaModel.__init__ (LlamaDecoderLayer without quant_config)"),
    QuantRule("vllm", "0.11.0", "0.11.0", "target", "the drafter is built with the target's quantization config "
              "(vllm_config.quant_config), so an unquantized drafter is run through the target's method",
              _V.format(v="0.11.0", f="llama_eagle3.py") + " LlamaModel.__init__ quant_config = "
              "vllm_config.quant_config; fixed by vllm-project/vllm#26590"),
    QuantRule("vllm", "0.11.1", None, "own", "the drafter uses its own quantization config (get_draft_quant_config), "
              "so an unquantized drafter stays unquantized", _V.format(v="0.11.1, 0.33.0", f="llama_eagle3.py")
              + " get_quant_config; " + _V.format(v="0.33.0", f="utils.py") + " get_draft_quant_config"),
    QuantRule("sglang", "0.5.23", None, "launch", "the drafter is loaded with --speculative-draft-model-quantization, "
              "else with the launch's --quantization (a quantization read from the target's config alone is not "
              "passed on)", _S.format(v="0.5.23", f="arg_groups/serving_hook.py") + " (speculative_draft_model_"
              "quantization defaults to quantization); " + _S.format(v="0.5.23", f="configs/model_config.py")
              + " ModelConfig.from_server_args (is_draft_model)"),
)


@dataclass(frozen=True)
class RotationRule:
    """Whether the engine folds a target's residual rotation into the drafter at load."""

    engine: str
    since: str
    until: str | None
    folds: bool
    source: str


ROTATION_RULES: tuple[RotationRule, ...] = (
    RotationRule("vllm", "0.10.1.1", None, False, "vllm 0.10.1.1, 0.11.0, 0.11.1, 0.33.0 vllm/model_executor/models/"
                 "llama_eagle3.py and 0.33.0 vllm/v1/spec_decode/: no rotation is read or applied (proposed in "
                 "vllm-project/vllm#36223 / #36225, open); vllm-ascend folds it from vllm-project/vllm-ascend#6914"),
    RotationRule("sglang", "0.5.23", None, False, "sglang 0.5.23 srt/speculative/ and srt/models/llama_eagle3.py: no "
                 "rotation is read or applied (sgl-project/sglang#30524, NPU only, open)"),
)

ENGINE_READ = {"vllm": "0.33.0", "sglang": "0.5.23"}  # the release the architecture tables were read from

EAGLE3_ARCHS: dict[str, frozenset[str]] = {
    "vllm": frozenset((
        "Alpamayo2SuperForConditionalGeneration", "CohereCompassForConditionalGeneration",
        "Cosmos3ForConditionalGeneration", "Exaone4_5_ForConditionalGeneration", "Gemma4ForConditionalGeneration",
        "Gemma4UnifiedForConditionalGeneration", "InternS1ProForConditionalGeneration", "InternS2MobiusForCausalLM",
        "InternS2MobiusForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
        "KimiK25ForConditionalGeneration", "LightOnOCRForConditionalGeneration", "Llama4ForConditionalGeneration",
        "LlavaForConditionalGeneration", "MiMoV2OmniForCausalLM", "MiniCPMOcrForConditionalGeneration",
        "MiniCPMV4_6ForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration",
        "Mistral3ForConditionalGeneration", "MuseGlimmerForCausalLM", "NemotronHForCausalLM",
        "OpenCUAForConditionalGeneration", "PixtralForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
        "Qwen3ASRForConditionalGeneration", "Qwen3NextForCausalLM", "Qwen3OmniMoeThinkerForConditionalGeneration",
        "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration",
        "RadioMBartPrefixForCausalLM")),
    "sglang": frozenset((
        "Cosmos3ForConditionalGeneration", "Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration",
        "InternS1ProForConditionalGeneration", "InternS2MobiusForCausalLM", "InternS2MobiusForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration", "KimiK25ForConditionalGeneration",
        "Llama4ForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", "Qwen3NextForCausalLM",
        "Qwen3OmniMoeThinkerForConditionalGeneration", "Qwen3VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Gemma3ForConditionalGeneration")),
}
NO_EAGLE3_ARCHS: dict[str, frozenset[str]] = {
    "vllm": frozenset((
        "AliceAIForCausalLM", "AriaForConditionalGeneration", "AudioFlamingo3ForConditionalGeneration",
        "BagelForConditionalGeneration", "BailingMoeV25ForCausalLM", "BailingMoeV3ForCausalLM",
        "BailingMoeV3VLForConditionalGeneration", "BeeForConditionalGeneration", "Blip2ForConditionalGeneration",
        "Cohere2VisionForConditionalGeneration", "CohereAsrForConditionalGeneration",
        "Cosmos3EdgeForConditionalGeneration", "DeepseekOCR2ForCausalLM", "DeepseekOCRForCausalLM",
        "DeepseekVLV2ForCausalLM", "DiffusionGemmaForConditionalGeneration", "DotsOCRForCausalLM",
        "Eagle2_5_VLForConditionalGeneration", "Ernie4_5_VLMoeForConditionalGeneration", "FalconH1ForCausalLM",
        "FireRedASR2ForConditionalGeneration", "FunASRForConditionalGeneration", "FunAudioChatForConditionalGeneration",
        "GLM4VForCausalLM", "Gemma3ForConditionalGeneration", "Gemma3nForConditionalGeneration",
        "Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration", "GlmAsrForConditionalGeneration",
        "GlmOcrForConditionalGeneration", "Granite4VisionForConditionalGeneration", "GraniteMoeHybridForCausalLM",
        "GraniteSpeechForConditionalGeneration", "GraniteSpeechPlusForConditionalGeneration", "HCXVisionV2ForCausalLM",
        "Idefics3ForConditionalGeneration", "InternS1ForConditionalGeneration", "IsaacForConditionalGeneration",
        "JambaForCausalLM", "KananaVForConditionalGeneration", "KeyeForConditionalGeneration",
        "KeyeVL1_5ForConditionalGeneration", "KimiAudioForConditionalGeneration", "KimiVLForConditionalGeneration",
        "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Lfm2VLForConditionalGeneration", "LlavaNextForConditionalGeneration",
        "LlavaNextVideoForConditionalGeneration", "LlavaOnevision2ForConditionalGeneration",
        "LlavaOnevisionForConditionalGeneration", "Molmo2ForConditionalGeneration", "MolmoForCausalLM",
        "Moondream3ForCausalLM", "MossTranscribeDiarizeForConditionalGeneration",
        "NemotronParseForConditionalGeneration", "OlmoHybridForCausalLM", "OpenPanguVLForConditionalGeneration",
        "PaddleOCRVLForConditionalGeneration", "PaliGemmaForConditionalGeneration", "Phi3VForCausalLM",
        "Phi4MMForCausalLM", "QianfanOCRForConditionalGeneration", "Qwen2AudioForConditionalGeneration",
        "Qwen2VLForConditionalGeneration", "Qwen2_5OmniThinkerForConditionalGeneration", "RForConditionalGeneration",
        "SmolVLMForConditionalGeneration", "Step3VLForConditionalGeneration", "Step3p7ForConditionalGeneration",
        "StepVLForConditionalGeneration", "UnlimitedOCRForCausalLM", "VoxtralForConditionalGeneration",
        "WhisperForConditionalGeneration", "Zamba2ForCausalLM",
    )),
    "sglang": frozenset((
        "BailingMoeV3ForCausalLM", "BailingMoeV3VLForConditionalGeneration", "Cohere2VisionForConditionalGeneration",
        "Cosmos3EdgeForConditionalGeneration", "DeepseekOCRForCausalLM", "DotsOCRForCausalLM",
        "Ernie4_5_VLMoeForConditionalGeneration", "FalconH1ForCausalLM", "Gemma3nForConditionalGeneration",
        "Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration", "GlmAsrForConditionalGeneration",
        "GlmOcrForConditionalGeneration", "GraniteMoeHybridForCausalLM", "InternS1ForConditionalGeneration",
        "KimiVLForConditionalGeneration", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "LightOnOCRForConditionalGeneration",
        "LlavaForConditionalGeneration", "MiniCPMV4_6ForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration",
        "Mistral3ForConditionalGeneration", "MuseGlimmerForCausalLM", "NemotronHForCausalLM",
        "PaddleOCRVLForConditionalGeneration", "Phi4MMForCausalLM", "PixtralForConditionalGeneration",
        "Qwen2AudioForConditionalGeneration", "Qwen2VLForConditionalGeneration", "Qwen3ASRForConditionalGeneration",
        "Step3VLForConditionalGeneration", "Step3p7ForConditionalGeneration", "StepVLForConditionalGeneration",
        "UnlimitedOCRForCausalLM", "VoxtralForConditionalGeneration", "WhisperForConditionalGeneration",
    )),
}


def quant_rule(engine: str | None, version: str | None) -> QuantRule | None:
    """The ``QUANT_RULES`` row for the engine at ``version`` (the newest read when None), or None when not read."""
    if engine not in ENGINE_READ:
        return None
    rows = [r for r in QUANT_RULES if r.engine == engine]
    return row_at(rows, version or ENGINE_READ[engine])


def rotation_rule(engine: str | None, version: str | None) -> RotationRule | None:
    """The ``ROTATION_RULES`` row for the engine at ``version``, or None when not read."""
    if engine not in ENGINE_READ:
        return None
    return row_at([r for r in ROTATION_RULES if r.engine == engine], version or ENGINE_READ[engine], until=False)


def eagle3_support(engine: str, arch: str | None) -> tuple[str, str]:
    """``(status, source)`` for EAGLE-3 on the target architecture ``arch``: ``yes`` (the model class captures aux
    states), ``no`` (the engine raises at start), ``unknown`` (not in the tables)."""
    read = ENGINE_READ.get(engine)
    if read is None or not arch:
        return "unknown", ""
    where = ("vllm {v} vllm/model_executor/models/ (SupportsEagle3); v1/worker/gpu_model_runner.py "
             "_setup_eagle3_aux_hidden_state_outputs" if engine == "vllm" else
             "sglang {v} sglang/srt/models/ (set_eagle3_layers_to_capture); srt/model_executor/model_runner_components/"
             "attention_backend_setup.py configure_aux_hidden_state_capture").format(v=read)
    if arch in EAGLE3_ARCHS[engine]:
        return "yes", where
    if arch in NO_EAGLE3_ARCHS[engine]:
        return "no", where
    return "unknown", ""
