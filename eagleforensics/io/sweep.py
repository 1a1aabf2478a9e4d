"""The capture helper: run a local HF transformers model and save the full residual-stream sweep.

It writes one safetensors file holding ``hidden.{p}`` for every position p = 0..N *raw*
(the last one taken from the final norm's input, which HF's ``output_hidden_states`` does
not return), ``final_norm`` (the post-norm state the lm_head reads), ``input_ids``, and
metadata (format, model type, N, H, dtype). It is the reference to compare training data
against when the serving engine cannot dump its own states. Needs ``transformers``;
loads only local files, never downloads. torch is imported inside the functions that run a
model or write tensors, so importing this module costs nothing.
"""
from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from ..arrays import as_array, is_torch, to_torch
from ..errors import ForensicsError
from .atomic import atomic_path
from .capture import CAPTURE_FORMAT, META_KEY
from .guards import check_regular_tree, memory_limit
from .modeldir import read_config
from .formats import read_safetensors_header
from .sizecheck import claimed_int, human_bytes

MAX_MODEL_LAYERS = 4096  # decoder layers a config may claim before the model is even sketched
MAX_CONFIG_BYTES = 4 * 1024 * 1024

if TYPE_CHECKING:
    import numpy as np
    import torch

DTYPES = ("float32", "bfloat16", "float16")


def _final_norm(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder's final norm module (``model.model.norm`` in Llama/Qwen/DeepSeek)."""
    base = getattr(model, "model", None) or getattr(model, getattr(model, "base_model_prefix", ""), None)
    norm = getattr(base, "norm", None)
    if norm is None:
        raise ForensicsError(f"{type(model).__name__}: cannot find the final norm (expected model.model.norm)")
    return norm


def sweep(model: torch.nn.Module, input_ids: Any) -> dict[str, torch.Tensor]:
    """Run one forward pass; return ``hidden.{p}`` for p=0..N raw, ``final_norm`` and ``input_ids``.

    ``input_ids`` is a tensor or an integer ndarray; the result holds torch tensors (the model's own).
    """
    import torch

    with torch.no_grad():
        return _sweep(model, input_ids if is_torch(input_ids) else to_torch(as_array(input_ids)))


def forward_with_final(model: torch.nn.Module, ids: torch.Tensor
                       ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]:
    """One forward pass of ``ids`` [B, S] without gradients: the model's ``hidden_states`` and the final
    norm's input (raw p = N) and output (post-norm), [B, S, H] each, caught by a hook on that norm
    (``hidden_states[-1]`` is post-norm in HF models, so the raw last state is only seen there)."""
    import torch

    grabbed: dict[str, torch.Tensor] = {}

    def hook(_module: Any, args: tuple[Any, ...], output: torch.Tensor) -> None:
        grabbed["raw"] = args[0].detach()
        grabbed["normed"] = output.detach()

    handle = _final_norm(model).register_forward_hook(hook)
    try:
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    finally:
        handle.remove()
    return out.hidden_states, grabbed["raw"], grabbed["normed"]


def _sweep(model: torch.nn.Module, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    import torch

    ids = input_ids.reshape(1, -1).to(torch.int64)
    hs, raw, normed = forward_with_final(model, ids)
    n = len(hs) - 1
    tensors = {f"hidden.{p}": hs[p][0] for p in range(n)}
    tensors[f"hidden.{n}"] = raw[0]
    tensors["final_norm"] = normed[0]
    tensors["input_ids"] = ids[0]
    return tensors


def write_capture(path: str | Path, tensors: dict[str, torch.Tensor | np.ndarray], model: Any,
                  dtype: str = "float32") -> Path:
    """Save a sweep (torch tensors or ndarrays) in the capture helper's self-describing safetensors format.

    Values are cast to ``dtype`` by torch (round to nearest even), so a given sweep always gives
    the same bytes whichever array type it came in."""
    import torch
    from safetensors.torch import save_file

    if dtype not in DTYPES:
        raise ForensicsError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    cfg = model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    want = getattr(torch, dtype)
    tensors = {k: (v if is_torch(v) else to_torch(as_array(v))).detach().cpu() for k, v in tensors.items()}
    out = {k: (v if k == "input_ids" else v.to(want)).contiguous() for k, v in tensors.items()}
    meta = {
        "format": CAPTURE_FORMAT,
        "model_type": str(getattr(cfg, "model_type", "unknown")),
        "num_hidden_layers": str(cfg.num_hidden_layers),
        "hidden_size": str(cfg.hidden_size),
        "dtype": dtype,
    }
    p = Path(path)
    # one metadata key holding sorted JSON: safetensors orders several keys arbitrarily,
    # which would break byte-for-byte regeneration of the samples
    with atomic_path(p) as tmp:  # all or nothing: a full disk leaves no half capture
        save_file(out, str(tmp), metadata={META_KEY: json.dumps(meta, sort_keys=True)})
    return p


def load_local_model(model_dir: str | Path) -> torch.nn.Module:
    """Load a causal LM from a local directory only (no hub access, no remote code)."""
    import torch
    import transformers as tf

    d = Path(model_dir)
    if not (d / "config.json").exists():
        raise ForensicsError("not a model directory (no config.json)", path=d)
    check_regular_tree(d, "model directory")  # transformers opens by name: a FIFO there would hang it
    check_model_size(d)
    try:
        with _quiet(tf):
            return tf.AutoModelForCausalLM.from_pretrained(str(d), local_files_only=True, dtype=torch.float32).eval()
    except Exception as exc:
        raise ForensicsError(f"cannot load the model: {' '.join(str(exc).split())[:200]}", path=d) from None


@contextlib.contextmanager
def _quiet(tf: Any) -> Iterator[None]:
    """transformers' progress bars and load report (a multi-line table with colour codes) kept off stderr:
    what went wrong reaches the user as the one line of the error it raises."""
    logging = tf.utils.logging
    level = logging.get_verbosity()
    bars = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def check_model_size(d: Path) -> None:
    """Refuse a model whose config.json claims more parameters than its weights hold, or than memory can take.

    transformers allocates every parameter its config implies, at that size, and initialises
    the ones the checkpoint lacks: a config claiming a vocabulary of 10^9 beside a small
    checkpoint would allocate it. The model is built on the meta device (shapes only, nothing
    allocated) once the layer count is bounded, and its float32 size compared with the
    parameters the safetensors headers declare and with the memory budget.
    """
    import torch
    import transformers as tf

    cfg = read_config(d / "config.json")
    for scope in (cfg, cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}):
        if "num_hidden_layers" in scope:
            claimed_int(scope["num_hidden_layers"], "config.json num_hidden_layers", d / "config.json", lo=1,
                        hi=MAX_MODEL_LAYERS)
    try:
        config = tf.AutoConfig.from_pretrained(str(d), local_files_only=True)
        with torch.device("meta"), _quiet(tf):
            skeleton = tf.AutoModelForCausalLM.from_config(config)
    except Exception as exc:
        raise ForensicsError(f"cannot build the model its config.json describes: {' '.join(str(exc).split())[:200]}",
                             path=d) from None
    claimed = sum(p.numel() for p in skeleton.parameters())
    budget = memory_limit() // 2
    if claimed * 4 > budget:
        raise ForensicsError(f"config.json describes {claimed:,} parameters ({human_bytes(claimed * 4)} as float32), "
                             f"past {human_bytes(budget)} (half the memory this process may use)", path=d)
    wanted = {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}
    stored = 0
    for f in sorted(d.glob("*.safetensors")):
        for name, info in read_safetensors_header(f).items():
            if name == "__metadata__":
                continue
            stored += math.prod(info["shape"])
            if name in wanted and tuple(info["shape"]) != wanted[name]:
                raise ForensicsError(f"tensor {name[:80]!r} has shape {list(info['shape'])} in {f.name} but config.json "
                                     f"implies {list(wanted[name])}: the config does not belong to these weights",
                                     path=d)
    if stored and claimed > 2 * stored + (1 << 20):
        raise ForensicsError(f"config.json describes {claimed:,} parameters but the safetensors files hold "
                             f"{stored:,}: the config does not belong to these weights", path=d)


def prompt_ids(model_dir: str | Path, prompt: str, *, chat: bool = True) -> tuple[torch.Tensor, str]:
    """The ids a server feeds the model for ``prompt``, and how they were made: a chat request (the user message
    through the directory's own chat template with the generation prompt, as ``capture --prompts`` and the engines
    render one) when ``chat`` and the directory has a chat template, else the text as written (a completion)."""
    import torch

    from .servedprompts import ServedPrompt
    from .tokenizer import has_tokenizer, load_tokenizer

    if chat and has_tokenizer(model_dir):
        tok = load_tokenizer(model_dir)
        if tok.chat_template is not None:
            request = ServedPrompt(1, messages=[{"role": "user", "content": prompt}], source=Path(model_dir))
            return (torch.tensor(request.token_ids(tok), dtype=torch.int64),
                    "a chat request through the model's chat template (--raw-prompt: the text as written)")
    return tokenize(model_dir, prompt), ("the text as written" if not chat else
                                         "the text as written: the model directory has no chat template")


def tokenize(model_dir: str | Path, prompt: str) -> torch.Tensor:
    """Token ids of ``prompt`` with the model directory's own tokenizer."""
    import torch
    import transformers as tf

    check_regular_tree(model_dir, "model directory")  # the tokenizer files are opened by name
    try:
        tok = tf.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:
        raise ForensicsError(f"no usable tokenizer ({' '.join(str(exc).split())[:160]}); pass --input-ids instead", path=model_dir) from None
    return torch.tensor(tok(prompt)["input_ids"], dtype=torch.int64)
