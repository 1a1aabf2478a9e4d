"""vLLM's ``extract_hidden_states`` files read as captures (the standard path for training data in vLLM and
speculators).

Layout, as vLLM 0.34.0 writes it (vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py
``_submit_async_write``, one ``<request id>.safetensors`` per request; speculators
speculators/cli/generate_offline_data.py moves them to ``hs_<i>.safetensors``): ``hidden_states`` [T, L, H], the
states of the draft config's ``eagle_aux_hidden_state_layer_ids`` stacked in that order on axis 1
(vllm/v1/worker/gpu/spec_decode/extract_hidden_states.py ``torch.stack(aux_hidden_states, dim=1)``), and
``token_ids`` [T]. The file does not store the layer ids: entry i is read as list index i (its position then comes
from its content; ``--capture-convention vllm`` reads index i as vLLM layer id i, right when the ids were 0..L-1).
vLLM's id k is the state entering layer k (position p=k), so id = layer count captures nothing.

A file with fewer state rows than ids is refused with both counts: a capture taken with prefix caching or
speculation on returns states only for the tokens the engine computed (vllm-project/vllm#44485,
sgl-project/sglang#26163; docs/causes.md row 9), and rows cannot be paired with ids by guessing.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import ForensicsError
from .filerows import PositionSource

STATES, IDS = "hidden_states", "token_ids"
SHORT_SOURCE = "vllm-project/vllm#44485, sgl-project/sglang#26163 (docs/causes.md row 9)"


def is_extract_file(entries: dict[str, Any], float_dtypes: Any) -> bool:
    """Whether a safetensors header's entries are an ``extract_hidden_states`` file's: [T, L, H] states and [T]
    ids and no other floating-point tensor."""
    hs, ids = entries.get(STATES), entries.get(IDS)
    if not isinstance(hs, dict) or not isinstance(ids, dict):
        return False
    others = [k for k, v in entries.items() if k not in (STATES, IDS) and v.get("dtype") in float_dtypes]
    return len(hs.get("shape", [])) == 3 and len(ids.get("shape", [])) == 1 and not others


def short_capture_message(ids: int, states: int) -> str:
    """The one line for a capture with fewer state rows than ids."""
    return (f"holds {ids} token ids but hidden states for only {states} of them: a capture taken with prefix caching "
            f"or speculative decoding on returns states only for the tokens the engine computed ({SHORT_SOURCE}); "
            "capture again with prefix caching and speculation off")


def extract_sources(path: Path, read: Callable[[str], Any], entries: dict[str, Any]
                    ) -> tuple[dict[int, PositionSource], dict[int, tuple[int, int]], np.ndarray]:
    """Per list index i: a source of rows [T, H] of ``hidden_states[:, i, :]``; their shapes; the ids."""
    t, layers, h = (int(n) for n in entries[STATES]["shape"])
    if not str(entries[IDS].get("dtype", "")).startswith(("I", "U")):
        raise ForensicsError("token_ids must be an integer tensor", path=path)
    ids = np.asarray(read(IDS)).reshape(-1).astype(np.int64, copy=False)
    if int(ids.shape[0]) != t:
        raise ForensicsError(short_capture_message(int(ids.shape[0]), t) if ids.shape[0] > t else
                             f"holds {t} hidden-state rows but only {int(ids.shape[0])} token ids", path=path)

    @lru_cache(maxsize=1)
    def whole() -> np.ndarray:
        return np.asarray(read(STATES))

    sources = {i: PositionSource(lambda i=i: np.ascontiguousarray(whole()[:, i, :]),
                                 lambda a, b, out=None, i=i: whole()[a:b, i, :]) for i in range(layers)}
    return sources, {i: (t, h) for i in range(layers)}, ids
