"""Engine rules as data: which residual-stream position each engine captures per id, per version.

Three small tables hold every fact, each row citing the released version and file it was read
from (wheels unpacked with ``pip download --no-deps``; TensorRT-LLM from its source):

* ``CAPTURE_RULES``: per engine, model family and version range, what id k captures (the
  capture index rule), what capture index 0 (the embedding) and index N (the raw last layer)
  do, the concatenation order and what a repeated id does.
* ``KEY_RULES``: per engine, version range and vLLM model runner, which draft-config keys are
  read (in order), what an empty list does, and whether ``eagle_config.use_aux_hidden_state:
  false`` switches capture off.
* ``RUNNER_RULES``: which model runner vLLM picks by default for an architecture.

``resolve`` picks one row of each for (engine, model type, version, runner) and returns a
``Rule``; ``positions_for_ids`` and ``ids_for_positions`` are the small generic appliers;
``answers_by_version`` re-runs a question over every version range the tables know so a caller
can say when the version changes the answer. Facts are collected in
docs/conventions.md; the rows below were re-checked against the wheels where the
source column names a version, and say "not re-read" where they were not.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from packaging.version import InvalidVersion, Version

from ..errors import ForensicsError
from ..positions import Position, default_aux_positions

ENGINES = ("vllm", "sglang", "trtllm")
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
RUNNERS = ("v1", "v2")
TRT_MODES = ("one-model", "two-model")
TOP_KEY = "eagle_aux_hidden_state_layer_ids"
NESTED_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"
NESTED_LAYER_IDS_KEY = "eagle_config.layer_ids"
YAML_KEY = "speculative_config.eagle3_layers_to_capture"
TRT_MAIN = "main"  # TensorRT-LLM rows come from its main-branch source, not a wheel

# model_type -> (family, HF architecture, is MoE). Kimi-K2.5 wraps the DeepSeek-V3 text model.
_MODELS: dict[str, tuple[str, str, bool]] = {
    "llama": ("llama", "LlamaForCausalLM", False),
    "mistral": ("llama", "MistralForCausalLM", False),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", False),
    "qwen3": ("qwen3", "Qwen3ForCausalLM", False),
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeForCausalLM", True),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM", True),
    "deepseek_v2": ("deepseek", "DeepseekV2ForCausalLM", True),
    "deepseek_v3": ("deepseek", "DeepseekV3ForCausalLM", True),
    "kimi_k2": ("deepseek", "DeepseekV3ForCausalLM", True),
    "kimi_k25": ("deepseek", "KimiK25ForConditionalGeneration", True),
    "gpt_oss": ("gpt_oss", "GptOssForCausalLM", True),
}
MODEL_TYPES = tuple(_MODELS)
FAMILIES = ("llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "deepseek", "gpt_oss")
_TYPE_OF_ARCH = {arch: mt for mt, (_, arch, _) in reversed(list(_MODELS.items()))}


# --- the tables --------------------------------------------------------------------------------

@dataclass(frozen=True)
class CaptureRow:
    """What id k captures on one engine for some families from ``since`` on.

    ``index``: the capture index each id becomes ("k", "k+1", "k+1 if ids[0]==1 else k",
    "k if max(ids)==N else k+1", or "none" when the family has no EAGLE-3 capture at all);
    capture index i means the state entering decoder layer i, i.e. position p = i.
    ``at_0`` / ``at_n``: what capture index 0 (embedding) / N (raw last layer) do:
    "p0" / "raw" (captured), "nothing" (silently never captured) or "raises".
    """

    engine: str
    families: tuple[str, ...]
    since: str
    until: str | None  # last release read where the row holds (None: up to the newest known)
    index: str
    at_0: str
    at_n: str
    source: str
    order: str = "ascending"
    mode: str | None = None  # TRT-LLM: one-model / two-model
    duplicates: str = "captured once"
    note: str = ""
    negative: str = "nothing"

    @property
    def label(self) -> str:
        fam = "/".join(self.families)
        mode = f" {self.mode}" if self.mode else ""
        return f"{self.engine} {fam}{mode} {release_span(self.since, self.until)}"


@dataclass(frozen=True)
class KeyRule:
    """Which draft-config keys one engine reads (first non-empty wins), from ``since`` on."""

    engine: str
    since: str
    until: str | None
    runner: str | None  # vLLM: v1 / v2; None elsewhere
    keys: tuple[str, ...]
    empty_list: str  # "absent" (falls through to the next key / the default) or "fails"
    use_aux_off: bool  # eagle_config.use_aux_hidden_state false switches capture off
    source: str
    note: str = ""

    @property
    def label(self) -> str:
        run = f" {self.runner} runner" if self.runner else ""
        return f"{self.engine}{run} keys {release_span(self.since, self.until)}"


@dataclass(frozen=True)
class RunnerRule:
    """Which vLLM model runner a plain ``vllm serve`` picks, from ``since`` on."""

    since: str
    until: str | None
    v2_when: str  # "never", "listed non-MoE", "listed", "listed or non-MoE", "always"
    listed: frozenset[str]
    source: str

    @property
    def label(self) -> str:
        return f"vllm default runner {release_span(self.since, self.until)}"

    def pick(self, model_type: str | None) -> str:
        """'v1' or 'v2' for ``model_type`` (unknown types count as non-MoE Llama)."""
        _, arch, moe = _MODELS.get(model_type or "llama", _MODELS["llama"])
        listed = arch in self.listed
        v2 = {"never": False, "listed non-MoE": listed and not moe, "listed": listed,
              "listed or non-MoE": listed or not moe, "always": True}[self.v2_when]
        return "v2" if v2 else "v1"


_LLAMA_LIKE = ("llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
_SGL = "sglang {v} srt/models/{f}"
_VLLM = "vllm {v} vllm/model_executor/models/{f}"

CAPTURE_RULES: tuple[CaptureRow, ...] = (
    # SGLang: set_eagle3_layers_to_capture turns ids into layers_to_capture; the model's forward
    # checks `i in layers_to_capture` for i in range(start_layer, end_layer) BEFORE layer i.
    CaptureRow("sglang", ("llama",), "0.4.10", "0.5.21", "k+1", "raises", "nothing",
               _SGL.format(v="0.5.3, 0.5.21", f="llama.py") + ": [val + 1 for val in layer_ids]; "
               "capture before layer i appends hidden_states + residual, residual is None at i=0"),
    CaptureRow("sglang", ("llama",), "0.5.22", None, "k+1", "p0", "nothing",
               _SGL.format(v="0.5.22", f="llama.py") + ": capture moved into the decoder layer "
               "(capture_output, AuxHiddenStateList), which handles the first layer"),
    CaptureRow("sglang", ("qwen3",), "0.4.10", None, "k+1", "p0", "nothing",
               _SGL.format(v="0.4.10, 0.5.3", f="qwen3.py") + " (0.4.10 :525-538 [val + 1 ...]; "
               "Qwen3Model extends qwen2.py Qwen2Model, whose capture guards residual None, 0.4.10 :329-333)"),
    CaptureRow("sglang", ("qwen2",), "0.4.10", "0.5.1.post3", "none", "nothing", "nothing",
               _SGL.format(v="0.4.10, 0.5.1, 0.5.1.post3", f="qwen2.py") + ": Qwen2ForCausalLM has no "
               "set_eagle3_layers_to_capture, which model_executor/model_runner.py calls (0.4.10 :361, "
               "0.5.1.post3 :380): AttributeError at start-up"),
    CaptureRow("sglang", ("qwen2",), "0.5.2", None, "k+1", "p0", "nothing",
               _SGL.format(v="0.5.2", f="qwen2.py") + ":637-650 [val + 1 for val in layer_ids]; "
               "Qwen2Model.forward :333-338 captures before layer i, residual None guarded (also 0.5.3)"),
    CaptureRow("sglang", ("qwen2_moe",), "0.4.10", "0.5.1.post3", "none", "nothing", "nothing",
               _SGL.format(v="0.4.10, 0.5.1, 0.5.1.post3", f="qwen2_moe.py") + ": Qwen2MoeForCausalLM "
               "has no set_eagle3_layers_to_capture (Qwen2MoeModel keeps an unused layers_to_capture): "
               "AttributeError at start-up"),
    CaptureRow("sglang", ("qwen2_moe",), "0.5.2", "0.5.4.post1", "k+1", "p0", "nothing",
               _SGL.format(v="0.5.2", f="qwen2_moe.py") + ":758-771 [val + 1 for val in layer_ids]; "
               "Qwen2MoeModel loop :524-529 captures before layer i, residual None guarded (also 0.5.3, "
               "0.5.4, 0.5.4.post1 :826-839, loop :587-592)"),
    CaptureRow("sglang", ("qwen3_moe",), "0.4.10", "0.5.4.post1", "k+1", "p0", "nothing",
               _SGL.format(v="0.4.10", f="qwen3_moe.py") + ":738-751 [val + 1 for val in layer_ids]; "
               "Qwen3MoeModel extends qwen2_moe.py Qwen2MoeModel, whose loop captures before layer i, "
               "residual None guarded (0.4.10 :478-483; same in 0.5.1.post3, 0.5.4.post1 :587-592)"),
    CaptureRow("sglang", ("qwen2_moe", "qwen3_moe"), "0.5.4.post2", None, "k+1", "p0", "raises",
               _SGL.format(v="0.5.4.post2", f="qwen2_moe.py") + ":562-565 Qwen2MoeModel."
               "set_eagle3_layers_to_capture marks self.layers[id + 1] (:854; qwen3_moe.py :789): "
               "index N is an IndexError at start-up, a negative index counts from the end (id -2 -> "
               "layer N-1 -> p N-1); the marked layer captures its own input (layers/communicator.py "
               ":229-238); same in 0.5.23 (qwen2_moe.py :1155-1156, :1418-1433)",
               note="0.5.4 and 0.5.4.post1 still capture in the model loop (qwen2_moe.py :587-592)",
               negative="from end"),
    CaptureRow("sglang", ("deepseek",), "0.4.10", "0.5.4.post1", "none", "nothing", "nothing",
               _SGL.format(v="0.5.3", f="deepseek_v2.py") + ": no set_eagle3_layers_to_capture"),
    CaptureRow("sglang", ("deepseek",), "0.5.4.post2", "0.5.12.post1", "k+1", "raises", "nothing",
               _SGL.format(v="0.5.4.post2, 0.5.12.post1", f="deepseek_v2.py") +
               ": [val + 1 for val in layer_ids]; capture before layer i appends hidden_states + "
               "residual"),
    CaptureRow("sglang", ("deepseek",), "0.5.13", "0.5.13", "k+1 if ids[0]==1 else k", "raises",
               "nothing", _SGL.format(v="0.5.13", f="deepseek_v2.py") + ": +1 only when "
               "layer_ids[0] == 1, else list(layer_ids) (PR #25454)"),
    CaptureRow("sglang", ("deepseek",), "0.5.14", "0.5.17", "k+1 if ids[0]==1 else k", "p0",
               "nothing", _SGL.format(v="0.5.14", f="deepseek_v2.py") + ": same id rule; capture "
               "moved into the layer (captured_last_layer_outputs), residual None guarded"),
    CaptureRow("sglang", ("deepseek",), "0.5.18", None, "k+1 if ids[0]==1 else k", "p0",
               "nothing", "docs/conventions.md: sglang 0.5.18 models/deepseek_v2.py preallocates one "
               "slot per id (not re-read)", duplicates="leaves an empty slot"),
    CaptureRow("sglang", ("gpt_oss",), "0.5.3", "0.5.16", "k+1", "raises", "nothing",
               _SGL.format(v="0.5.3, 0.5.16", f="gpt_oss.py") + ": [val + 1 ...]; capture before "
               "layer i appends hidden_states + residual"),
    CaptureRow("sglang", ("gpt_oss",), "0.5.17", None, "k if max(ids)==N else k+1", "p0", "raw",
               _SGL.format(v="0.5.17", f="gpt_oss.py") + ": list(layer_ids) when max(layer_ids) "
               "== num_layers, else +1; every boundary 0..N reachable (docs/conventions.md)"),
    # vLLM: id k = capture index k (no shift); ids are sorted and de-duplicated.
    CaptureRow("vllm", _LLAMA_LIKE, "0.10.1.1", "0.17.1", "k", "raises", "nothing",
               _VLLM.format(v="0.17.1", f="llama.py") + ": `idx in aux_hidden_state_layers` "
               "before layer idx appends hidden_states + residual (residual None at idx 0)",
               duplicates="captured once (ids de-duplicated)"),
    CaptureRow("vllm", _LLAMA_LIKE, "0.18.0", None, "k", "p0", "raw",
               _VLLM.format(v="0.18.0, 0.34.0", f="interfaces.py") + " EagleModelMixin."
               "_maybe_add_hidden_state, called with 0 before layer 0 and idx+1 after layer idx "
               "(llama.py; the same in 0.34.0)", duplicates="captured once (ids de-duplicated)"),
    CaptureRow("vllm", ("gpt_oss",), "0.10.1.1", "0.10.2", "none", "nothing", "nothing",
               "docs/conventions.md: gpt-oss EAGLE-3 in vllm from 0.11.0 (0.10.x not re-read)"),
    CaptureRow("vllm", ("gpt_oss",), "0.11.0", "0.17.1", "k", "p0", "nothing",
               _VLLM.format(v="0.17.1", f="gpt_oss.py") + ": appends x if residual is None "
               "else x + residual before layer i", duplicates="captured once (ids de-duplicated)"),
    CaptureRow("vllm", ("gpt_oss",), "0.18.0", None, "k", "p0", "raw",
               _VLLM.format(v="0.33.0, 0.34.0", f="gpt_oss.py") + ": _maybe_add_hidden_state(0) and (i+1)",
               duplicates="captured once (ids de-duplicated)"),
    CaptureRow("vllm", ("deepseek",), "0.10.1.1", "0.17.1", "none", "nothing", "nothing",
               _VLLM.format(v="0.17.1", f="deepseek_v2.py") + ": no SupportsEagle3"),
    CaptureRow("vllm", ("deepseek",), "0.18.0", "0.25.1", "k", "raises", "nothing",
               _VLLM.format(v="0.18.0, 0.22.0", f="deepseek_v2.py") + ": SupportsEagle3; "
               "capture before layer idx appends hidden_states + residual (TypeError at idx 0)",
               duplicates="captured once (ids de-duplicated)"),
    CaptureRow("vllm", ("deepseek",), "0.26.0", None, "k", "raises", "raw",
               _VLLM.format(v="0.26.0, 0.33.0, 0.34.0", f="deepseek_v2.py") + ": also appends "
               "hidden_states + residual when end_layer is in aux_hidden_state_layers",
               duplicates="captured once (ids de-duplicated)"),
    # TensorRT-LLM: id k is captured at the END of decoder layer k (p = k+1); -1 = post-norm.
    CaptureRow("trtllm", FAMILIES, TRT_MAIN, None, "k+1", "nothing", "raw",
               "TensorRT-LLM main tensorrt_llm/_torch/speculative/eagle3.py (source, no wheel): "
               "Eagle3OneModelSpecMetadata.__post_init__ only sorts the ids (-1 lands first); "
               "maybe_capture_hidden_states saves hidden_states + residual after layer k; -1 = "
               "model output after the norm (docs/conventions.md)",
               order="sorted: -1 (post-norm) FIRST", mode="one-model"),
    CaptureRow("trtllm", FAMILIES, TRT_MAIN, None, "k+1", "nothing", "raw",
               "TensorRT-LLM main tensorrt_llm/_torch/speculative/eagle3.py (source, no wheel): "
               "Eagle3SpecMetadata.__post_init__ sorts, then moves a leading -1 to the end",
               order="sorted: -1 (post-norm) last", mode="two-model"),
)

_GMR = "vllm {v} vllm/v1/worker/gpu_model_runner.py _get_eagle3_aux_layers_from_config"
_V2U = "vllm {v} vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"
KEY_RULES: tuple[KeyRule, ...] = (
    KeyRule("sglang", "0.4.10", "0.5.12", None, (NESTED_KEY,), "fails", False,
            "sglang 0.5.3 srt/model_executor/model_runner.py: eagle_config["
            "'eagle_aux_hidden_state_layer_ids'] only (missing -> default, [] passed through); "
            "use_aux_hidden_state not read (also 0.5.4.post2)"),
    KeyRule("sglang", "0.5.12.post1", None, None, (NESTED_KEY,), "fails", True,
            "sglang 0.5.12.post1 srt/model_executor/model_runner.py, 0.5.23 model_runner_"
            "components/spec_aux_hidden_state.py: nested key only, eagle_config.get("
            "'use_aux_hidden_state', True)", note="use_aux_hidden_state first seen in "
            "0.5.12.post1; releases between 0.5.4.post2 and it were not read"),
    KeyRule("vllm", "0.10.1.1", "0.11.0", "v1", (), "absent", False,
            "vllm 0.11.0 vllm/v1/worker/gpu_model_runner.py: no _get_eagle3_aux_layers_from_"
            "config, the model's default is always used"),
    KeyRule("vllm", "0.11.1", "0.17.0", "v1", (TOP_KEY,), "absent", False,
            _GMR.format(v="0.11.1, 0.11.2") + ": top-level key only (docs/conventions.md said from "
            "0.11.2)"),
    KeyRule("vllm", "0.17.1", "0.21.0", "v1", (TOP_KEY,), "absent", True,
            _GMR.format(v="0.17.1, 0.21.0") + ": top-level only; vllm/v1/spec_decode/eagle.py "
            "_get_eagle3_use_aux_hidden_state_from_config", note="use_aux_hidden_state first "
            "seen in 0.17.1 (absent in 0.11.2)"),
    KeyRule("vllm", "0.22.0", "0.33.0", "v1", (TOP_KEY, NESTED_KEY), "absent", True,
            _GMR.format(v="0.22.0, 0.33.0") + ": top-level, else dflash_config, else "
            "eagle_config['eagle_aux_hidden_state_layer_ids']", note="the V1 runner is gone from 0.34.0 "
            "(see V1_REMOVED)"),
    KeyRule("vllm", "0.17.1", "0.27.1", "v2", (TOP_KEY,), "absent", False,
            _V2U.format(v="0.17.1, 0.26.0") + " get_eagle3_aux_layers_from_config: top-level "
            "key only"),
    KeyRule("vllm", "0.28.0", "0.32.0", "v2", (TOP_KEY, NESTED_LAYER_IDS_KEY), "absent", False,
            _V2U.format(v="0.28.0, 0.30.0") + ": top-level, then eagle_config['layer_ids'] "
            "(never eagle_config.eagle_aux_hidden_state_layer_ids); use_aux_hidden_state not read"),
    KeyRule("vllm", "0.33.0", None, "v2", (TOP_KEY, NESTED_LAYER_IDS_KEY), "absent", True,
            _V2U.format(v="0.33.0, 0.34.0") + ": as 0.28 plus requires_aux_hidden_states reads "
            "eagle_config.use_aux_hidden_state (0.34.0: the same key lookup; the switch moved to "
            "vllm/v1/worker/gpu/spec_decode/eagle/config.py Eagle3SpeculatorConfig.uses_aux_hidden_states, "
            "same default true)", note="0.31 and 0.32 not read"),
    KeyRule("trtllm", TRT_MAIN, None, None, (YAML_KEY,), "absent", False,
            "docs/conventions.md: TensorRT-LLM llmapi/llm_args.py speculative_config."
            "eagle3_layers_to_capture (a set); the draft checkpoint is never read for ids"),
)

_CFG = "vllm {v} vllm/config/vllm.py use_v2_model_runner"
RUNNER_RULES: tuple[RunnerRule, ...] = (
    RunnerRule("0.10.1.1", "0.21.0", "never", frozenset(),
               "vllm 0.21.0 vllm/config/vllm.py: no use_v2_model_runner (V1 unless "
               "VLLM_USE_V2_MODEL_RUNNER=1)"),
    RunnerRule("0.22.0", "0.23.0", "listed non-MoE", frozenset({"Qwen3ForCausalLM"}),
               _CFG.format(v="0.22.0") + ", DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES = "
               "{Qwen3ForCausalLM}, not MoE, not quantized"),
    RunnerRule("0.24.0", "0.25.1", "listed", frozenset({
        "Qwen3ForCausalLM", "DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM",
        "GraniteMoeForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"}),
               _CFG.format(v="0.24.0") + ": architecture in DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES"),
    RunnerRule("0.26.0", "0.28.0", "listed or non-MoE", frozenset({
        "DeepseekV2ForCausalLM", "DeepseekV4ForCausalLM", "GraniteMoeForCausalLM",
        "Qwen2MoeForCausalLM", "KimiK3ForConditionalGeneration"}),
               _CFG.format(v="0.26.0, 0.28.0") + ": listed architecture or not model_config."
               "is_moe (DeepseekV3ForCausalLM, Qwen3MoeForCausalLM, GptOssForCausalLM stay V1)"),
    RunnerRule("0.29.0", "0.33.0", "always", frozenset(),
               _CFG.format(v="0.29.0, 0.30.0, 0.33.0") + ": V2 for every model unless a "
               "feature V2 lacks is on (docs/conventions.md said from 0.30)"),
    RunnerRule("0.34.0", None, "always", frozenset(),
               "vllm 0.34.0 vllm/platforms/interface.py: V2 only, the V1 model runner was removed "
               "(vllm/v1/worker/gpu_model_runner.py is gone; VLLM_USE_V2_MODEL_RUNNER other than 1 "
               "is refused at start, 1 is called redundant); vllm/config/vllm.py has no use_v2_model_runner"),
)

# The first vLLM release without the V1 model runner (the RUNNER_RULES row above cites it): a V1 question
# at or after it is bad input, and a vLLM rule's default runner there is V2.
V1_REMOVED = "0.34.0"
_LAST_V1 = max((r.until for r in KEY_RULES if r.runner == "v1" and r.until), key=Version)  # 0.33.0

NEWEST = {"sglang": "0.5.23", "vllm": "0.34.0", "trtllm": TRT_MAIN}


def release_span(since: str, until: str | None) -> str:
    """A rules row's releases in words: ``0.5.7 - 0.5.9``, ``0.11.0`` (one release), ``>= 0.5.18`` (no end read:
    up to the newest release the rules know). Every versioned table of the engines room says its span here."""
    if until is None:
        return f">= {since}"
    return since if since == until else f"{since} - {until}"


# --- versions ----------------------------------------------------------------------------------

def parse_version(version: str) -> Version:
    """'0.5.12.post1' -> Version; ``.postN`` and pre-releases order as packaging says."""
    try:
        return _parsed(str(version).strip().lstrip("vV"))
    except InvalidVersion:
        raise ForensicsError(f"version {version!r} is not of the form X.Y.Z (a release number "
                             "like 0.5.13 or 0.5.12.post1)") from None


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> Version:
    """Version(text), cached: one align resolves every engine's rules at every known version (over
    1000 parses, ~8 ms of a command). A Version is immutable; text it refuses raises again every time."""
    return Version(text)


def _v(version: str) -> Version:
    """A table's version text (TensorRT-LLM's main branch orders first), through ``_parsed``'s cache."""
    return Version("0") if version == TRT_MAIN else _parsed(version)


# --- families ------------------------------------------------------------------------------------

def family_of(model_type: str | None) -> str:
    """Map an HF ``model_type`` (or an architecture name) to a rule family."""
    if model_type is None:
        return "llama"
    key = str(model_type).strip()
    mt = _TYPE_OF_ARCH.get(key, key.lower())
    if mt not in _MODELS:
        raise ForensicsError(f"unknown model_type {model_type!r}; known: {', '.join(MODEL_TYPES)}")
    return _MODELS[mt][0]


def model_type_of_arch(arch: str) -> str | None:
    """The model_type whose rules an HF architecture name follows, None when unknown."""
    return _TYPE_OF_ARCH.get(str(arch))


def check_vllm_runner(version: str, runner: str | None) -> str | None:
    """``runner`` unless vLLM ``version`` has no such runner (V1 from ``V1_REMOVED`` on): then one line, raised.
    None stays None (each table's default applies)."""
    if runner == "v1" and parse_version(version) >= parse_version(V1_REMOVED):
        raise ForensicsError(f"vLLM {version} has no V1 model runner (removed in {V1_REMOVED}: "
                             "vllm/platforms/interface.py refuses VLLM_USE_V2_MODEL_RUNNER=0; V1 runs up to "
                             f"{_LAST_V1}): pass --engine-version with the release you run (with no version the "
                             f"newest read, {NEWEST['vllm']}, is assumed), or --vllm-runner v2, or leave it out")
    return runner


def runner_or_default(version: str, runner: str | None) -> str:
    """The vLLM runner a table answers for: ``runner`` checked, else V1 (the tables' default) before
    ``V1_REMOVED`` and V2 from it on."""
    if check_vllm_runner(version, runner) is not None:
        return str(runner)
    return "v2" if parse_version(version) >= parse_version(V1_REMOVED) else "v1"


def default_runner(version: str, model_type: str | None) -> tuple[str, RunnerRule]:
    """The vLLM model runner a plain ``vllm serve`` of ``version`` picks for ``model_type``."""
    row = _pick(RUNNER_RULES, version)
    return row.pick(model_type), row


# --- resolution ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """The rows that apply to one (engine, family, version, runner/mode): what the appliers use."""

    engine: str
    family: str
    model_type: str | None
    version: str
    capture: CaptureRow
    keys: KeyRule
    runner: str | None = None
    runner_row: RunnerRule | None = None
    version_given: bool = True
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """Short name of the rule: engine, family, version (and runner or mode)."""
        extra = f" {self.runner} runner" if self.runner else (
            f" {self.capture.mode}" if self.capture.mode else "")
        ver = "" if self.engine == "trtllm" else f" {self.version}"
        return f"{self.engine}{ver} {self.family}{extra}"

    @property
    def write_key(self) -> str | None:
        """The key to write so this engine reads it (the first it reads), None when none is read."""
        return self.keys.keys[0] if self.keys.keys else None

    @property
    def supported(self) -> bool:
        return self.capture.index != "none"


def row_at(rows: Iterable[Any], version: str, *, until: bool = True) -> Any | None:
    """The row with the greatest ``since`` <= ``version``, None before the first; None too when that row has an
    ``until`` below ``version`` (``until=False``: the tables here, whose ``until`` only labels the range). Every
    versioned table of the engines room picks its row here."""
    def key(text: str) -> Version:
        return _v(text) if text == TRT_MAIN else parse_version(text)

    v = key(version)
    best = None
    for r in sorted(rows, key=lambda r: key(r.since)):
        if key(r.since) <= v:
            best = r
    end = getattr(best, "until", None) if until else None
    return None if end is not None and key(end) < v else best


def _pick(rows: Sequence, version: str, match: Callable[[object], bool] = lambda r: True):
    """The row with the greatest ``since`` <= version among those ``match`` accepts (the earliest before any)."""
    cands = [r for r in rows if match(r)]
    if not cands:
        raise ForensicsError("internal: no rule row for this engine")
    return row_at(cands, version, until=False) or min(cands, key=lambda r: _v(r.since))


def resolve(engine: str, model_type: str | None = None, version: str | None = None,
            runner: str | None = None, mode: str | None = None) -> Rule:
    """The rule ``engine`` applies to ``model_type`` at ``version`` (None: the newest known)."""
    eng = str(engine).strip().lower()
    if eng not in ENGINES:
        raise ForensicsError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    family = family_of(model_type)
    mt = None if model_type is None else _TYPE_OF_ARCH.get(str(model_type), str(model_type).lower())
    notes: list[str] = []
    if model_type is None:
        notes.append(f"model type unknown: assumed the {ENGINE_NAMES[eng]} Llama rule (pass "
                     "--model-type or --target)")
    if runner is not None and eng != "vllm":
        raise ForensicsError(f"--vllm-runner applies to vLLM only, not {eng}")
    if mode is not None and mode not in TRT_MODES:
        raise ForensicsError(f"unknown TensorRT-LLM mode {mode!r}; choose {' or '.join(TRT_MODES)}")
    given = version is not None
    if eng == "trtllm":
        if given:
            notes.append(f"TensorRT-LLM rules come from its main-branch source; version {version} "
                         "was not checked separately")
        ver = TRT_MAIN
    else:
        ver = str(parse_version(version)) if given else NEWEST[eng]
        if not given:
            notes.append(f"no engine version given: answered for {ENGINE_NAMES[eng]} {ver}, the "
                         "newest release the rules table knows (pass --engine-version)")
        elif parse_version(ver) > parse_version(NEWEST[eng]):
            notes.append(f"{ENGINE_NAMES[eng]} {ver} is newer than the newest release the table "
                         f"knows ({NEWEST[eng]}): its rules were assumed unchanged")
    rows = [r for r in CAPTURE_RULES if r.engine == eng and family in r.families]
    if eng == "trtllm":
        rows = [r for r in rows if r.mode == (mode or "one-model")]
    cap = _pick(rows, ver)
    if eng != "trtllm" and _v(ver) < _v(cap.since):
        notes.append(f"{ENGINE_NAMES[eng]} {ver} is older than the table's first {family} row "
                     f"({cap.since}): that row was assumed")
    run_row = None
    if eng == "vllm":
        if runner is None:
            runner, run_row = default_runner(ver, mt)
        elif runner not in RUNNERS:
            raise ForensicsError(f"unknown vLLM runner {runner!r}; choose v1 or v2")
        elif runner == "v1":
            check_vllm_runner(ver, runner)
        elif runner == "v2" and _v(ver) < _v("0.17.1"):
            raise ForensicsError(f"the rules table knows the vLLM V2 model runner from 0.17.1, "
                                 f"not {ver}: pass --vllm-runner v1")
    keys = _pick(KEY_RULES, ver, lambda r: r.engine == eng and r.runner == runner)
    return Rule(eng, family, mt, ver, cap, keys, runner, run_row, given or eng == "trtllm",
                tuple(notes))


# --- appliers ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CaptureOutcome:
    """What one configured id makes the engine capture; ``position`` None when nothing usable.

    ``effect``: captured, nothing, raises, duplicate or unsupported.
    """

    id: int
    position: Position | None
    note: str | None = None
    effect: str = "captured"


@dataclass(frozen=True)
class IdPlan:
    """The id list that captures given positions in order, or None with the reasons why not."""

    ids: list[int] | None
    reasons: list[str]
    notes: list[str] = field(default_factory=list)


def _check_layers(num_layers: int) -> int:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ForensicsError(f"num_layers must be a positive integer, got {num_layers!r}")
    return num_layers


def _check_ints(values: Sequence[int], what: str) -> list[int]:
    out = list(values)
    if any(isinstance(v, bool) or not isinstance(v, int) for v in out):
        raise ForensicsError(f"{what} must be a list of integers, got {out!r}")
    return out


def _shift(index: str, ids: Sequence[int], n: int) -> int:
    """How much the engine adds to every id; some rules look at the whole list."""
    if index == "k":
        return 0
    if index == "k+1":
        return 1
    if index == "k+1 if ids[0]==1 else k":
        return 1 if ids and ids[0] == 1 else 0
    if index == "k if max(ids)==N else k+1":
        return 0 if ids and max(ids) == n else 1
    raise ForensicsError(f"internal: unknown index rule {index!r}")


def _outcome(rule: Rule, k: int, idx: int, n: int) -> CaptureOutcome:
    row, name = rule.capture, ENGINE_NAMES[rule.engine]
    if rule.engine == "trtllm" and k == -1:
        where = "FIRST" if "FIRST" in row.order else "last"
        return CaptureOutcome(k, Position(n, normed=True),
                              f"-1 = final state after the norm, concatenated {where} ({row.mode})")
    if idx == 0:
        if row.at_0 == "p0":
            return CaptureOutcome(k, Position(0), "embedding output (captured before layer 0)")
        if row.at_0 == "raises":
            return CaptureOutcome(k, None, f"capture index 0 meets residual None before the first "
                                  f"layer: {name} raises at run time ({row.label})", "raises")
        return CaptureOutcome(k, None, f"id {k} captures nothing on {row.label}", "nothing")
    if idx == n:
        if row.at_n == "raw":
            return CaptureOutcome(k, Position(n), "raw last-layer output, before the final norm")
        if row.at_n == "raises":
            return CaptureOutcome(k, None, f"id {k} asks for layer index {n}: {name} raises "
                                  f"IndexError at start-up ({row.label})", "raises")
        return CaptureOutcome(k, None, f"id {k} asks for layer index {n}, which the capture loop "
                              f"over layers 0..{n - 1} never reaches: captures nothing "
                              f"({row.label})", "nothing")
    if 0 < idx < n:
        return CaptureOutcome(k, Position(idx))
    if idx < 0 and row.negative == "from end":
        if idx < -n:
            return CaptureOutcome(k, None, f"id {k} asks for layer index {idx}, beyond the first of {n} "
                                  f"layers counted from the end: {name} raises IndexError at start-up "
                                  f"({row.label})", "raises")
        return CaptureOutcome(k, Position(n + idx), f"id {k} is layer index {idx}, counted from the end: the "
                              f"input of layer {n + idx} ({row.label})")
    if idx > n and row.at_n == "raises":
        return CaptureOutcome(k, None, f"id {k} asks for layer index {idx} > {n}: {name} raises "
                              f"IndexError at start-up ({row.label})", "raises")
    return CaptureOutcome(k, None, f"id {k} is outside the ids {name} can capture for N={n}: "
                          "captures nothing", "nothing")


def positions_for_ids(rule: Rule, ids: Sequence[int], num_layers: int) -> list[CaptureOutcome]:
    """What ``rule``'s engine captures for each id, in the order given (duplicates capture once)."""
    n = _check_layers(num_layers)
    id_list = _check_ints(ids, "ids")
    row = rule.capture
    if not rule.supported:
        why = f"{row.label} has no EAGLE-3 capture for this family: serving fails"
        return [CaptureOutcome(k, None, why, "unsupported") for k in id_list]
    shift = _shift(row.index, id_list, n)
    seen: set[int] = set()
    out: list[CaptureOutcome] = []
    for k in id_list:
        idx = k + shift
        layer = n + idx if row.negative == "from end" and -n <= idx < 0 else idx  # the layer it marks
        if layer in seen:
            what = f"duplicate id {k}" if idx == layer else f"id {k} marks layer {layer} again"
            out.append(CaptureOutcome(k, None, f"{what}: {row.duplicates}", "duplicate"))
            continue
        seen.add(layer)
        out.append(_outcome(rule, k, idx, n))
    return out


def concat_order(outcomes: Sequence[CaptureOutcome], rule: Rule | None = None) -> list[Position]:
    """Captured positions in the order the engine concatenates them (by layer; TRT-LLM one-model
    puts the post-norm final first, two-model last)."""
    got = {o.position for o in outcomes if o.position is not None}
    raw = sorted((q for q in got if not q.normed), key=lambda q: q.p)
    normed = [q for q in got if q.normed]
    if rule is not None and "FIRST" in rule.capture.order:
        return normed + raw
    return raw + normed


def served_positions(rule: Rule, ids: list[int] | None, num_layers: int) -> list[Position]:
    """What the engine feeds the drafter: for ``ids`` (None = the engine's default)."""
    n = _check_layers(num_layers)
    if not rule.supported:
        return []
    if ids is None:
        if rule.engine == "trtllm" and n <= 5:
            raise ForensicsError(f"TensorRT-LLM has no default capture for {n} layers (needs N > 5)")
        return [Position(p) for p in default_aux_positions(n)]
    return concat_order(positions_for_ids(rule, ids, n), rule)


def default_ids(rule: Rule, num_layers: int) -> list[int]:
    """Ids, in ``rule``'s own meaning, that capture what the engine does when none are set.

    Every engine's default captures p [2, N//2, N-3] (SGLang stores its default list unshifted,
    so in its id meaning that list is [1, N//2-1, N-4]).
    """
    n = _check_layers(num_layers)
    if rule.engine == "trtllm" and n <= 5:
        raise ForensicsError(f"TensorRT-LLM has no default capture for {n} layers (needs N > 5)")
    plan = ids_for_positions(rule, default_aux_positions(n), n)
    return plan.ids if plan.ids is not None else default_aux_positions(n)


def _order_reasons(pos: list[int], n: int) -> list[str]:
    reasons: list[str] = []
    bad = [p for p in pos if not 0 <= p <= n]
    if bad:
        reasons.append(f"positions {bad} are outside 0..{n} for a {n}-layer model")
    if len(set(pos)) != len(pos):
        reasons.append(f"duplicate positions in {pos}: every engine captures each layer once")
    if any(a > b for a, b in zip(pos, pos[1:])):
        reasons.append(
            f"positions {pos} are not in ascending order: every engine concatenates captured "
            "layer states in ascending layer order, so no id list reproduces this slot order; "
            "reorder the training slots or retrain")
    return reasons


def ids_for_positions(rule: Rule, positions: Sequence[int], num_layers: int) -> IdPlan:
    """The id list making ``rule``'s engine capture exactly ``positions`` (raw, in this order).

    Generic: try the ids that the shift rules suggest (p-1, then p) and keep the first list
    that the forward rule maps back onto ``positions``; otherwise say what each would capture.
    """
    n = _check_layers(num_layers)
    pos = _check_ints(positions, "positions")
    reasons = _order_reasons(pos, n)
    if not pos:
        reasons.append("no positions given")
    if not rule.supported:
        reasons.append(f"{rule.capture.label} has no EAGLE-3 capture for the {rule.family} family")
    if reasons:
        return IdPlan(None, reasons)
    tried: list[tuple[list[int], list[CaptureOutcome]]] = []
    for cand in ([p - 1 for p in pos], list(pos)):
        if any(c == cand for c, _ in tried):
            continue
        outs = positions_for_ids(rule, cand, n)
        tried.append((cand, outs))
        if all(o.effect == "captured" for o in outs) and [
                o.position for o in outs] == [Position(p) for p in pos]:
            return IdPlan(cand, [])
    why: list[str] = []
    for p in pos:
        if p == 0:
            why.append(_edge_reason(rule, 0, n))
        elif p == n:
            why.append(_edge_reason(rule, n, n))
    if not why:
        why = [f"ids {c} would capture {[o.position.label if o.position else None for o in outs]}"
               for c, outs in tried]
        why.insert(0, f"no id list makes {rule.capture.label} capture {pos}")
    return IdPlan(None, [w for w in why if w])


def _edge_reason(rule: Rule, p: int, n: int) -> str:
    row = rule.capture
    if p == 0 and row.at_0 != "p0":
        how = {"raises": "capture index 0 meets residual None and raises",
               "nothing": "no id reaches it"}[row.at_0]
        if rule.engine == "trtllm":
            how = "TRT-LLM captures only at the end of a decoder layer (p=k+1) or the post-norm final (-1)"
        return f"the embedding output (p=0) cannot be captured on {row.label}: {how}"
    if p == n and row.at_n != "raw":
        how = {"raises": "the id that reaches it raises IndexError at start-up",
               "nothing": f"the capture loop over layers 0..{n - 1} never reaches index {n}"}[row.at_n]
        return f"p={n} (raw last layer output) cannot be captured on {row.label}: {how}"
    return ""


# --- versions that change the answer ---------------------------------------------------------------

def _segments(engine: str, family: str, runner_fixed: bool) -> list[tuple[str, str]]:
    """(first version, label) of every version range over which all the engine's rows hold."""
    caps = [r for r in CAPTURE_RULES if r.engine == engine and family in r.families]
    starts = {r.since for r in caps} | {r.since for r in KEY_RULES if r.engine == engine}
    if engine == "vllm" and not runner_fixed:
        starts |= {r.since for r in RUNNER_RULES}
    first = min((_v(r.since) for r in caps), default=Version("0"))
    starts = {s for s in starts if _v(s) >= first}  # no row for this family before its first
    rows: list = [*caps, *[k for k in KEY_RULES if k.engine == engine]]
    if engine == "vllm" and not runner_fixed:
        rows += list(RUNNER_RULES)
    known = sorted({v for r in rows for v in (r.since, r.until) if v is not None}, key=_v)
    order = sorted(starts, key=_v)
    out = []
    for i, s in enumerate(order):
        if i + 1 == len(order):
            out.append((s, f">= {s}"))
            continue
        nxt = _v(order[i + 1])
        before = [v for v in known if _v(s) <= _v(v) < nxt]
        end = before[-1] if before else None
        out.append((s, s if end == s else f"{s} - {end}" if end else f"{s} - <{order[i + 1]}"))
    return out


def answers_by_version(engine: str, model_type: str | None, ask: Callable[[Rule], Hashable],
                       runner: str | None = None, mode: str | None = None
                       ) -> list[tuple[str, Hashable]]:
    """``ask(rule)`` over every version range the tables know, neighbours with equal answers merged.

    Returns [(versions, answer)], oldest first; one entry means the version does not matter.
    """
    eng = str(engine).strip().lower()
    if eng == "trtllm":
        return [(TRT_MAIN, ask(resolve(eng, model_type, None, None, mode)))]
    merged: list[list] = []
    for start, label in _segments(eng, family_of(model_type), runner is not None):
        if runner == "v2" and _v(start) < _v("0.17.1"):
            continue
        if runner == "v1" and _v(start) >= _v(V1_REMOVED):
            continue
        if runner == "v1" and label.startswith(">= "):  # the V1 runner's last release, not the newest
            label = f"{start} - {_LAST_V1}" if start != _LAST_V1 else start
        ans = ask(resolve(eng, model_type, start, runner))
        if merged and merged[-1][1] == ans:
            merged[-1][0].append(label)
        else:
            merged.append([[label], ans])
    return [(_join_spans(labels), ans) for labels, ans in merged]


def _join_spans(labels: list[str]) -> str:
    first, last = labels[0], labels[-1]
    if len(labels) == 1:
        return first
    start = first.split(" - ")[0]
    if last.startswith(">= "):
        return f">= {start}"
    return f"{start} - {last.split(' - ')[-1]}"


# --- documentation --------------------------------------------------------------------------------

def describe_rules() -> list[dict]:
    """Every row of the three tables as plain dicts (``table`` says which), for docs and reports."""
    out: list[dict] = []
    for name, rows in (("capture", CAPTURE_RULES), ("keys", KEY_RULES), ("runner", RUNNER_RULES)):
        for r in rows:
            d = asdict(r)
            if "listed" in d:
                d["listed"] = sorted(d["listed"])
            out.append({"table": name, "label": r.label, **d})
    return out


@dataclass(frozen=True)
class Target:
    """One engine as the reports list it: label (the engine name), description, key it reads."""

    label: str
    description: str
    id_key: str


ENGINE_TARGETS: tuple[Target, ...] = (
    Target("vllm", "vLLM: id k -> p=k (0 embedding and N raw last layer from 0.18.0)",
           f"{TOP_KEY} (the V2 runner, default from 0.29, never reads {NESTED_KEY})"),
    Target("sglang", "SGLang: id k -> p=k+1 (DeepSeek/Kimi >= 0.5.13: p=k unless ids[0]==1)",
           NESTED_KEY),
    Target("trtllm", "TensorRT-LLM: id k -> p=k+1; -1 = final state after the norm",
           f"YAML {YAML_KEY}"),
)
ALL_TARGETS = ENGINE_TARGETS


def trainer_final_expectation(trainer: str) -> str:
    """Which kind of final state a trainer's loss expects: post-norm or raw (pre-norm)."""
    key = str(trainer).strip().lower()
    if key == "specforge":
        return ("post-norm: SpecForge applies only lm_head to the stored final state, so it "
                "expects the state after the final norm (docs/conventions.md; "
                "SpecForge source not re-read)")
    if key == "speculators":
        return ("raw/pre-norm: speculators computes targets as verifier_lm_head(verifier_norm("
                "verifier_last_hidden_states)), so it expects the last layer output before "
                "the norm (vllm-project/speculators models/eagle3 core forward)")
    raise ForensicsError(f"unknown trainer {trainer!r}; choose specforge or speculators")
