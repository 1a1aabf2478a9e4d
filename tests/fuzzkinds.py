"""More input kinds for ``scripts/fuzz.py``: YAML and JSON draft configs, draft directories, server logs, nested archives.

Each ``KindCase`` starts from a real file of its kind (a TensorRT-LLM YAML and a SpecForge
config as tests/drafts.py writes them, a draft directory whose ``model.safetensors`` holds
a real ``fc.weight`` header, the engine log fixtures, a ``.ckpt.gz`` whose inner torch zip
stores its records deflated, an ``.npz`` of real token ids), applies byte edits and, for the
text kinds, hostile splices (anchors and aliases, deep nesting, a very long line), and runs
the reader the CLI uses. It ends as ``result`` or ``clean-error`` (a one-line ForensicsError),
anything else is a ``failure``.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import struct
import traceback
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from .mutations import SAMPLES, Edit, apply_edits, edits

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
KINDS = ("yaml", "json", "draft-dir", "log", "log-gz", "nested-ckpt-gz", "npz")
SPLICES = (
    b"&a [1, 2, 3]", b"*a", b"[" * 200, b"]" * 200, b"{" * 100, b"x" * 3000, b"\x1b[2J\n", b"\x00",
    b"a: &x [*x]", b"- - - - - - - - - - - -", b'"eagle_aux_hidden_state_layer_ids": [' * 50,
)


@dataclass(frozen=True)
class KindCase:
    """A file of one of ``KINDS``, with byte edits and splices (offset fraction, text) applied."""

    kind: str
    edits: tuple[Edit, ...]
    splices: tuple[tuple[float, bytes], ...] = ()
    fifo: bool = False  # draft-dir only: model.safetensors is a FIFO

    @property
    def target(self) -> str:
        return {"yaml": "extra_llm_api.yaml", "json": "config.json", "draft-dir": "model.safetensors",
                "log": "server.log", "log-gz": "server.log.gz", "nested-ckpt-gz": "data_0.ckpt.gz",
                "npz": "ids.npz"}[self.kind]

    # for scripts/fuzz.py, which reports cases by side
    side = "other"


def _yaml() -> bytes:
    return (b"speculative_config:\n  decoding_type: Eagle\n  max_draft_len: 3\n"
            b"  eagle3_layers_to_capture: [1, 15, 28]\n")


def _config() -> bytes:
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "num_hidden_layers": 1,
           "model_type": "llama", "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}}
    return json.dumps(cfg).encode()


def _draft_safetensors() -> bytes:
    header = {"fc.weight": {"dtype": "F32", "shape": [64, 192], "data_offsets": [0, 64 * 192 * 4]},
              "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(64 * 192 * 4)


def _nested_ckpt() -> bytes:
    """data_0.ckpt re-zipped with its records deflated, then gzipped: an archive inside an archive."""
    out = io.BytesIO()
    with zipfile.ZipFile(SAMPLES / "data_0.ckpt") as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    return out.getvalue()


def _npz() -> bytes:
    import numpy as np
    import torch

    ids = torch.load(SAMPLES / "capture.pt", weights_only=True)["input_ids"].numpy()
    buf = io.BytesIO()
    np.savez_compressed(buf, input_ids=ids)
    return buf.getvalue()


BASES = {"yaml": _yaml, "json": _config, "draft-dir": _draft_safetensors,
         "log": lambda: (FIXTURES / "sglang_0.5.5_broken.log").read_bytes(),
         "log-gz": lambda: (FIXTURES / "vllm_0.33.log").read_bytes(),
         "nested-ckpt-gz": _nested_ckpt, "npz": _npz}
_CACHE: dict[str, bytes] = {}


def base(kind: str) -> bytes:
    if kind not in _CACHE:
        _CACHE[kind] = BASES[kind]()
    return _CACHE[kind]


@st.composite
def kind_cases(draw: Any, max_edits: int = 3) -> KindCase:
    kind = draw(st.sampled_from(KINDS))
    size = len(base(kind))
    ed = tuple(draw(st.one_of(st.just([]), edits(size, max_edits))))
    splices: tuple[tuple[float, bytes], ...] = ()
    if kind in ("yaml", "json", "log", "log-gz"):
        splices = tuple(draw(st.lists(st.tuples(st.floats(0, 1), st.sampled_from(SPLICES)), max_size=3)))
    fifo = kind == "draft-dir" and draw(st.integers(0, 9)) == 0
    return KindCase(kind, ed, splices, fifo)


def mutated(case: KindCase) -> bytes:
    data = apply_edits(base(case.kind), list(case.edits))
    for frac, text in case.splices:
        at = int(frac * len(data))
        data = data[:at] + text + data[at:]
    if case.kind in ("log-gz", "nested-ckpt-gz"):
        data = gzip.compress(data, mtime=0)
    return data


def write(case: KindCase, scratch: Path) -> Path:
    """Write the case into ``scratch/in``; returns what the reader is given (a file or a draft directory)."""
    scratch.mkdir(parents=True, exist_ok=True)
    target = scratch / f"mutated_{case.target}"
    if target.exists() or target.is_symlink():
        target.unlink()
    if case.kind == "draft-dir":
        d = scratch / "draft"
        d.mkdir(exist_ok=True)
        (d / "config.json").write_bytes(_config())
        inside = d / "model.safetensors"
        if inside.exists() or inside.is_symlink():
            inside.unlink()
        if case.fifo:
            os.mkfifo(inside)
            target.write_bytes(b"(a FIFO)")
        else:
            data = mutated(case)
            inside.write_bytes(data)
            target.write_bytes(data)
        return d
    target.write_bytes(mutated(case))
    return target


def run(case: KindCase, scratch: Path) -> tuple[str, str, str]:
    """(kind, detail, signature) after running the CLI's reader for this input kind."""
    from eagleforensics.engines.draftconfig import audit_config
    from eagleforensics.engines.logs import parse_log
    from eagleforensics.errors import ForensicsError
    from eagleforensics.io.safeload import load_object
    from eagleforensics.io.training import load_training

    path = write(case, scratch)
    try:
        if case.kind == "yaml":
            audit_config(path, "trtllm", num_layers=32).to_dict()
        elif case.kind in ("json", "draft-dir"):
            audit_config(path, "sglang", num_layers=32).to_dict()
        elif case.kind in ("log", "log-gz"):
            parse_log(path)
        elif case.kind == "nested-ckpt-gz":
            load_training(path)
        else:
            load_object(path)
    except ForensicsError as exc:
        text = str(exc)
        if "\n" in text:
            return "failure", f"multi-line ForensicsError: {text!r}", "multi-line message"
        return "clean-error", text, ""
    except Exception as exc:  # noqa: BLE001 - anything that is not a clean end is what the fuzzer looks for
        tb = traceback.extract_tb(exc.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb) if "eagleforensics" in f.filename),
                     "?")
        return ("failure", f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
                f"{case.kind}: {type(exc).__name__} at {where}")
    return "result", case.kind, ""
