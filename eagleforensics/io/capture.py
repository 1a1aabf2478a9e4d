"""Inference-side captures: a sweep of hidden states over residual-stream positions, read lazily.

Accepted layouts (each integer is read through ``convention``, see ``CONVENTIONS``):

* what ``torch.save(out.hidden_states)`` writes: a tuple/list of N+1 tensors ``[1,T,H]`` or
  ``[T,H]``; HF replaces the last entry by the final-normed state
  (docs/conventions.md, "A transformers quirk");
* a dict with such a list under ``hidden_states`` and optional ``input_ids``;
* a dict or safetensors file with keys ``<name>.<int>`` (and optional ``input_ids``);
* a directory of per-position files whose names carry an integer;
* the capture helper's safetensors file (``eagleforensics capture``), self-describing.

Positions are read one at a time through ``Capture.read`` so a large sweep never has to
fit in memory at once: a torch file's tensors stay in the file (``torchfile.StoredTensor``) and
their rows are read from it on demand, like a safetensors file's. Every hidden state and id list
handed out is a numpy array (bf16 as ``arrays.BF16``); no capture format imports torch (only
``allow_unsafe`` does, through ``torch.load``).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..arrays import dtype_name, is_float, numpy_dtype
from ..errors import ForensicsError
from ..positions import Position
from .filerows import PositionSource, file_locator, safetensors_rows
from .guards import parse_json
from .formats import sniff
from .safeload import check_file, load_object, open_safetensors, read_tensor
from .sizecheck import key_number

CAPTURE_FORMAT = "eagleforensics-capture-v1"
META_KEY = "eagleforensics"  # safetensors metadata key holding the capture helper's JSON
CONVENTIONS = {
    "hf": "integer i = output_hidden_states[i] = position p=i; the highest (p=N) is the post-norm final",
    "vllm": "integer k = position p=k (vLLM: k=N is the raw last-layer output before the norm)",
    "sglang": "integer k = layer id, captured as position p=k+1 (SGLang Llama/Qwen rule)",
    "trtllm": "integer k = position p=k+1 (end of layer k); -1 = the post-norm final",
}
_SEPARATORS = "._-["


def int_suffix(key: str) -> tuple[str, str] | None:
    """(name, number text) of a key or file stem that ends in an integer (``layer_12`` -> ('layer', '12')), else None.

    By hand, in one pass from the end: the regex it replaces (``^(.*?)[._\\-\\[]?(-?\\d+)\\]?$``) retried
    every split of a long digit run, so a key of 40k digits and a letter took minutes. Same answers: the
    number is the whole trailing digit run (an optional ``]`` after it), signed when ``-`` follows a
    separator; the name holds no line break; one final line break is allowed, as ``$`` allows it.
    """
    body = key[:-1] if key.endswith("\n") else key
    if body.endswith("]"):
        body = body[:-1]
    j = len(body)
    while j > 0 and body[j - 1].isdecimal():
        j -= 1
    if j == len(body):
        return None
    digits = body[j:]
    if j >= 2 and body[j - 2] in _SEPARATORS and body[j - 1] == "-":
        name, num = body[:j - 2], "-" + digits
    elif j >= 1 and body[j - 1] in _SEPARATORS:
        name, num = body[:j - 1], digits
    else:
        name, num = body[:j], digits
    return None if "\n" in name else (name, num)
LABEL_KINDS = {
    "sweep": "the integers are read through the convention (a full HF tuple, the capture helper's file, or a "
             "convention given for the stored integers)",
    "keys": "stored integers (key names, file names) that cannot be a full HF tuple, read as positions as labelled",
    "list-index": "indices of a list too short to be a full HF tuple: they say nothing about positions",
}


@dataclass
class SweepHeader:
    """What alignment knows about any capture-like source before reading rows (a capture, a fingerprint)."""

    path: str
    convention: str
    num_layers: int | None
    num_layers_source: str
    hidden_size: int
    num_tokens: int
    dtype: np.dtype  # the narrowest stored dtype (arrays.BF16 for bf16); arrays.dtype_name for people
    input_ids: np.ndarray | None  # int64 [T]


@dataclass
class Capture(SweepHeader):
    """A lazily read sweep: ``positions`` lists what exists, ``read(pos)`` returns a [T, H] ndarray."""

    readers: dict[Position, Callable[[], np.ndarray]]
    metadata: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # how the integers were read, when not as declared
    # what the positions' labels rest on (LABEL_KINDS): a full sweep's structure, stored integers read as
    # positions, or list indices that cannot be positions (evidence.labels checks each against content)
    label_kind: str = "sweep"
    # the target's greedy next token after each of rows [0, n) (-1 where the final state is NaN/Inf), per target
    # lm_head (``greedy_key``): the doctor's first pass over the lm_head fills it (drafter-baseline's replay, the
    # coverage check or replay, whichever runs first), the later ones read it
    greedy: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def positions(self) -> list[Position]:
        return sorted(self.readers)

    def read(self, pos: Position) -> np.ndarray:
        """The [T, H] array at ``pos`` (as stored; callers convert dtype in chunks, e.g. ``arrays.f32``)."""
        return self.readers[pos]()

    def read_rows(self, pos: Position, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows [start, stop) of ``pos``, read from the file alone where the format allows (bounded memory).

        ``out`` is a buffer of the stored dtype the file reader may fill (a view may come back instead)."""
        src = self.readers[pos]
        if isinstance(src, PositionSource):
            return src.rows(start, stop, out=out)
        return src()[start:stop]

    @property
    def streams(self) -> bool:
        """True when every position's rows can be read without loading the whole position."""
        return all(isinstance(s, PositionSource) and s.streams for s in self.readers.values())


def greedy_key(target_dir: str | Path, head_name: str) -> str:
    """Which target lm_head a ``Capture.greedy`` entry came from: the target folder (resolved) and the tensor."""
    return f"{Path(target_dir).resolve()}::{head_name}"


def _stored(t: Any) -> bool:
    """A torch file's tensor not read yet (``torchfile.StoredTensor``; that module is loaded only for torch files)."""
    tf = sys.modules.get(__package__ + ".torchfile")
    return tf is not None and isinstance(t, tf.StoredTensor)


def _is_tensor(t: Any) -> bool:
    """An array, or a torch file's tensor not read yet."""
    return isinstance(t, np.ndarray) or _stored(t)


def _rows(t: Any, what: str, path: str) -> Any:
    if not _is_tensor(t):
        raise ForensicsError(f"{what} is {type(t).__name__}, expected a tensor", path=path)
    if not is_float(t.dtype):
        raise ForensicsError(f"{what} holds {dtype_name(t.dtype)} values; hidden states must be floating point", path=path)
    if t.ndim == 3 and t.shape[0] == 1:
        t = t[0] if isinstance(t, np.ndarray) else t.squeeze0()
    if t.ndim == 3:
        raise ForensicsError(f"{what} has a batch of {t.shape[0]} sequences; capture one sequence", path=path)
    if t.ndim != 2:
        raise ForensicsError(f"{what} has shape {list(t.shape)}; expected [T, H] or [1, T, H]", path=path)
    return t


def _source(t: Any) -> PositionSource:
    """A position held by array ``t``, or by a torch file's tensor: then its rows are read from the file
    (``FileRows``) where they lie plainly, else it is read whole once (compressed, in memory, strided)."""
    if isinstance(t, np.ndarray):
        return PositionSource.of_array(t)
    rows = t.file_rows()
    if rows is None:
        return PositionSource.of_array(t.read())
    return PositionSource(rows.read, rows.read)


def _is_int(t: Any) -> bool:
    return _is_tensor(t) and t.dtype.kind in "biu"


def _ids(t: Any, path: str) -> np.ndarray | None:
    if t is None:
        return None
    if not _is_int(t):
        raise ForensicsError("input_ids must be an integer tensor", path=path)
    t = t.read() if _stored(t) else t
    return t.reshape(-1).astype(np.int64, copy=False)


def _position_of(num: int, convention: str, top: int | None) -> Position:
    """Translate a stored integer into a residual-stream position under ``convention``."""
    if convention == "hf":
        return Position(num, normed=top is not None and num == top)
    if convention == "vllm":
        return Position(num)
    if convention == "sglang":
        return Position(num + 1)
    if convention == "trtllm":
        return Position(-1) if num == -1 else Position(num + 1)  # -1 fixed up once N is known
    raise ForensicsError(f"unknown capture convention {convention!r}; choose one of {', '.join(CONVENTIONS)}")


def _build(
    path: str, convention: str, numbered: dict[int, Callable[[], np.ndarray]],
    shapes: dict[int, tuple[int, ...]], dtypes: dict[int, np.dtype], input_ids: np.ndarray | None,
    num_layers: int | None, metadata: dict[str, Any], listed: bool = False,
) -> Capture:
    """The capture from numbered sources; ``listed``: the integers are a list's indices, not stored labels."""
    if not numbered:
        raise ForensicsError("no hidden-state positions found (expected a list of tensors or keys like 'hidden_states.3')", path=path)
    top = max(numbered)
    notes: list[str] = []
    as_labelled = convention == "hf" and _not_a_sweep(sorted(numbered), num_layers)
    if as_labelled and listed:
        notes.append(f"the capture is a list of {len(numbered)} entries, which cannot be a full HF "
                     f"output_hidden_states tuple ({as_labelled}): its indices say nothing about positions, so "
                     "each entry's position comes from its content only (pass --capture-convention if the indices "
                     "are ids)")
    elif as_labelled:
        notes.append(f"the capture's integers {_ints(sorted(numbered))} cannot be a full HF output_hidden_states "
                     f"tuple ({as_labelled}), so they are read as positions as labelled, all raw (before any norm); "
                     "pass --capture-convention if they mean something else")
    readers: dict[Position, Callable[[], np.ndarray]] = {}
    for num, reader in numbered.items():
        pos = Position(num) if as_labelled else _position_of(num, convention, top)
        readers[pos] = reader
    source = "given" if num_layers is not None else "HF tuple: entries - 1"
    if as_labelled and num_layers is None:
        source = "inferred from the deepest position (pass --num-layers if the sweep stops short)"
    if num_layers is None:
        # the deepest position stored; an engine-side dump may stop short of p=N
        num_layers = max((p.p for p in readers if p.p >= 0), default=0)
        if convention != "hf":
            source = "inferred from the deepest position (pass --num-layers if the sweep stops short)"
    if Position(-1) in readers:  # TensorRT-LLM's -1: post-norm final
        readers[Position(num_layers, normed=True)] = readers.pop(Position(-1))
    shape_set = {(s[-2], s[-1]) for s in shapes.values()}
    if len(shape_set) != 1:
        raise ForensicsError(_ragged(shapes), path=path)
    ((t, h),) = shape_set
    if t == 0 or h == 0:
        raise ForensicsError(f"capture positions are empty (shape [{t}, {h}])", path=path)
    if input_ids is not None and int(input_ids.shape[0]) > t:  # fewer states than ids: prefix cache or speculation
        from .vllmextract import short_capture_message

        raise ForensicsError(short_capture_message(int(input_ids.shape[0]), t), path=path)
    if input_ids is not None and int(input_ids.shape[0]) != t:
        raise ForensicsError(f"input_ids has {int(input_ids.shape[0])} tokens but the hidden states have {t}", path=path)
    lowest = min(dtypes.values(), key=lambda d: d.itemsize)
    kind = ("list-index" if listed else "keys") if as_labelled else "sweep"
    return Capture(path, convention, num_layers, source, h, t, lowest, input_ids, readers, metadata, notes, kind)


MIN_HF_ENTRIES = 4  # fewer entries than this are not "N layers + embedding" of any real model


def _not_a_sweep(nums: list[int], num_layers: int | None) -> str:
    """Why integers read under the HF convention cannot be a full output_hidden_states tuple ('' if they can)."""
    if nums != list(range(nums[-1] + 1)):
        return "not a contiguous 0..N run"
    if len(nums) < MIN_HF_ENTRIES:
        return f"only {len(nums)} entries, too few for a sweep"
    if num_layers is not None and nums[-1] != num_layers:
        return f"they stop at {nums[-1]}, not at N={num_layers}"
    return ""


def _ints(nums: list[int]) -> str:
    return "[" + ", ".join(map(str, nums[:8])) + (", ..." if len(nums) > 8 else "") + "]"


def _ragged(shapes: dict[int, tuple[int, ...]]) -> str:
    """Name the shape most positions share and the positions that differ (T or H)."""
    counts: dict[tuple[int, int], list[int]] = {}
    for n, s in sorted(shapes.items()):
        counts.setdefault((s[-2], s[-1]), []).append(n)
    common = max(counts, key=lambda k: len(counts[k]))
    odd = [f"entry {n} is {list(k)}" for k, ns in counts.items() if k != common for n in ns]
    what = " and ".join(w for w, i in (("token count T", 0), ("hidden size H", 1))
                        if any(k[i] != common[i] for k in counts))
    return (f"ragged capture: positions differ in {what}; most are [T, H] = {list(common)} but "
            f"{', '.join(odd[:6])}{' ...' if len(odd) > 6 else ''}; all positions must come from one forward pass")


def _from_sequence(seq: list[Any], path: str, convention: str, ids: Any, num_layers: int | None, meta: dict[str, Any]) -> Capture:
    if convention == "hf" and num_layers is not None and len(seq) != num_layers + 1:
        raise ForensicsError(f"holds {len(seq)} hidden states but a model of {num_layers} layers gives "
                             f"{num_layers + 1} (output_hidden_states): entries are missing or extra, so every "
                             "position after the gap would be mislabelled", path=path)
    tensors = {i: _rows(t, f"entry {i}", path) for i, t in enumerate(seq)}
    return _build(
        path, convention, {i: _source(t) for i, t in tensors.items()},
        {i: tuple(t.shape) for i, t in tensors.items()}, {i: t.dtype for i, t in tensors.items()},
        _ids(ids, path), num_layers, meta, listed=True,
    )


def _numbered_keys(keys: list[str], path: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for k in keys:
        m = int_suffix(k)
        if not m:
            continue
        num = key_number(m[1], k, path)
        if num in out:
            raise ForensicsError(f"keys {out[num]!r} and {k!r} both claim position {num}", path=path)
        out[num] = k
    return out


def _from_mapping(obj: dict[str, Any], path: str, convention: str, num_layers: int | None) -> Capture:
    if isinstance(obj.get("hidden_states"), (list, tuple)):
        meta = {k: v for k, v in obj.items() if isinstance(v, (str, int, float, bool))}
        return _from_sequence(list(obj["hidden_states"]), path, convention, obj.get("input_ids"), num_layers, meta)
    floats = [k for k, v in obj.items() if _is_tensor(v) and is_float(v.dtype)]
    _refuse_integer_states({k: dtype_name(v.dtype) for k, v in obj.items() if _is_tensor(v) and v.ndim >= 2
                            and not is_float(v.dtype)}, path)
    numbered = _numbered_keys(floats, path)
    if not numbered:
        _refuse_training_record(list(obj), path)
    tensors = {n: _rows(obj[k], repr(k), path) for n, k in numbered.items()}
    meta = {str(k): v for k, v in (obj.get("__metadata__") or {}).items()}
    return _build(
        path, convention, {n: _source(t) for n, t in tensors.items()},
        {n: tuple(t.shape) for n, t in tensors.items()}, {n: t.dtype for n, t in tensors.items()},
        _ids(obj.get("input_ids"), path), num_layers, meta,
    )


_ST_DTYPES = {"F64": numpy_dtype("float64"), "F32": numpy_dtype("float32"), "F16": numpy_dtype("float16"),
              "BF16": numpy_dtype("bfloat16")}


def _from_safetensors(p: Path, convention: str, num_layers: int | None) -> Capture:
    """Lazy safetensors capture: only the header is read here; tensors on demand."""
    from .formats import read_safetensors_header

    header = read_safetensors_header(p)
    handle = open_safetensors(p)
    meta = dict(header.get("__metadata__") or {})
    path = str(p)
    ids = read_tensor(handle, "input_ids", p) if "input_ids" in header else None
    own = _own_metadata(meta, p)
    if own is not None:
        meta = own
        return _from_own_format(p, handle, header, meta, ids, num_layers)
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    from .vllmextract import extract_sources, is_extract_file

    if is_extract_file(entries, _ST_DTYPES):  # vLLM extract_hidden_states: [T, L, H] and token_ids
        sources, shapes, ids = extract_sources(p, lambda k: read_tensor(handle, k, p), entries)
        dt = _ST_DTYPES[entries["hidden_states"]["dtype"]]
        return _build(path, convention, dict(sources), shapes, {i: dt for i in sources}, ids, num_layers,
                      {**meta, "format": "vllm extract_hidden_states"}, listed=True)
    floats = [k for k, v in entries.items() if v.get("dtype") in _ST_DTYPES]
    bad = [k for k, v in entries.items() if k != "input_ids" and v.get("dtype") not in _ST_DTYPES]
    _refuse_integer_states({k: entries[k].get("dtype") for k in bad if len(entries[k].get("shape", [])) >= 2}, path)
    numbered = _numbered_keys(floats, path)
    if not numbered:
        _refuse_training_record(list(entries), path)
    if not numbered and bad:
        raise ForensicsError(f"tensor {bad[0]!r} holds {entries[bad[0]].get('dtype')} values; hidden states must be floating point", path=p)
    shapes = {n: _squeeze_shape(entries[k]["shape"], k, path) for n, k in numbered.items()}
    return _build(
        path, convention, {n: PositionSource(lambda k=k: _rows(read_tensor(handle, k, p), repr(k), path),
                                             safetensors_rows(p, header, k, _ST_DTYPES[entries[k]["dtype"]]).read)
                           for n, k in numbered.items()},
        shapes, {n: _ST_DTYPES[entries[k]["dtype"]] for n, k in numbered.items()}, _ids(ids, path), num_layers, meta,
    )


_F32 = numpy_dtype("float32")
TRAINING_KEYS = ("loss_mask", "aux_hidden_state", "aux_hidden_states", "hidden_state", "target", "attention_mask")


def _refuse_training_record(keys: list[Any], path: str) -> None:
    """A file whose keys are a training record's, given where a capture belongs: say so (exit 2)."""
    found = [str(k) for k in keys if str(k) in TRAINING_KEYS]
    if found:
        raise ForensicsError(f"holds no numbered hidden-state positions but has training-record keys "
                             f"({', '.join(found)}): did you swap TRAIN and CAPTURE? (align TRAIN CAPTURE)", path=path)


def _refuse_integer_states(dtypes: dict[str, Any], path: str, numbered_only: bool = True) -> None:
    """A numbered [T, H]-like tensor of integers or bools is a hidden state stored wrongly, not metadata."""
    for key, dtype in dtypes.items():
        if not numbered_only or int_suffix(str(key)):
            raise ForensicsError(f"{key!r} holds {dtype} values; hidden states must be floating point", path=path)


def _own_metadata(meta: dict[str, Any], p: Path) -> dict[str, Any] | None:
    """The capture helper's metadata if this file is one of its captures, else None."""
    raw = meta.get(META_KEY)
    if raw is None:
        return None
    try:
        own = parse_json(raw, p, f"{META_KEY!r} metadata")  # nesting bounded: the string is the file's to write
        if not re.fullmatch(r"[0-9]{1,6}", str(own["num_hidden_layers"])):  # written as text by write_capture
            raise ValueError
    except (ValueError, TypeError, KeyError):
        raise ForensicsError(f"corrupt {META_KEY!r} metadata in the capture file", path=p) from None
    return own if own.get("format") == CAPTURE_FORMAT else None


def _squeeze_shape(shape: list[int], key: str, path: str) -> tuple[int, ...]:
    if len(shape) == 3 and shape[0] == 1:
        shape = shape[1:]
    if len(shape) != 2:
        raise ForensicsError(f"{key!r} has shape {list(shape)}; expected [T, H] or [1, T, H]", path=path)
    return tuple(shape)


def _from_own_format(p: Path, handle: Any, header: dict[str, Any], meta: dict[str, Any], ids: Any, num_layers: int | None) -> Capture:
    path = str(p)
    n = int(meta.get("num_hidden_layers", -1))
    readers: dict[int, str] = {}
    for key in header:
        m = re.fullmatch(r"hidden\.(\d+)", key)
        if m:
            readers[key_number(m.group(1), key, path)] = key
    _refuse_integer_states({k: header[k].get("dtype") for k in [*readers.values(), "final_norm"]
                            if k in header and header[k].get("dtype") not in _ST_DTYPES}, path, numbered_only=False)
    if n < 1 or (readers and max(readers) != n):
        raise ForensicsError(f"capture metadata says num_hidden_layers={n} but the file holds hidden.0.."
                             f"hidden.{max(readers, default=-1)}: corrupt capture (the helper writes p=0..N)", path=p)
    if "final_norm" in header:
        readers[n + 1] = "final_norm"  # placeholder integer, relabelled below
    cap = _build(
        path, "vllm",
        {k: PositionSource(lambda key=key: _rows(read_tensor(handle, key, p), repr(key), path),
                           safetensors_rows(p, header, key, _ST_DTYPES.get(header[key]["dtype"], _F32)).read)
         for k, key in readers.items()},
        {k: _squeeze_shape(header[key]["shape"], key, path) for k, key in readers.items()},
        {k: _ST_DTYPES.get(header[key]["dtype"], _F32) for k, key in readers.items()},
        _ids(ids, path), num_layers if num_layers is not None else n, meta,
    )
    if "final_norm" in header:
        cap.readers[Position(n, normed=True)] = cap.readers.pop(Position(n + 1))
    cap.convention = "eagleforensics"
    cap.num_layers_source = "given" if num_layers is not None else "capture metadata"
    return cap


def _from_directory(d: Path, convention: str, num_layers: int | None, allow_unsafe: bool) -> Capture:
    files = [f for f in sorted(d.iterdir()) if f.is_file() and not f.name.startswith(".")]
    ids = None
    numbered: dict[int, Path] = {}
    for f in files:
        stem = f.name.split(".")[0]
        if stem in ("input_ids", "token_ids"):
            ids = _single(load_object(f, allow_unsafe=allow_unsafe, lazy=True), f, want_float=False)
            continue
        m = int_suffix(stem)
        if m:
            numbered[key_number(m[1], f.name, str(d))] = f
    if not numbered:
        raise ForensicsError("directory holds no files named with a position number (like layer_3.pt)", path=d)
    cache: dict[int, Any] = {}

    def reader(n: int) -> Callable[[], np.ndarray]:
        def read() -> np.ndarray:
            t = _rows(_single(load_object(numbered[n], allow_unsafe=allow_unsafe), numbered[n]), numbered[n].name,
                      str(numbered[n]))
            return t
        return read

    # shapes need one look per file: a torch file's tensors stay in it (lazy), others are dropped right after
    sources: dict[int, PositionSource] = {}
    for n, f in numbered.items():
        obj = load_object(f, allow_unsafe=allow_unsafe, lazy=True)
        cache[n] = _rows(_single(obj, f), f.name, str(f))
        if _stored(cache[n]):
            rows = cache[n].file_rows()
        else:
            locate = file_locator(f, obj)
            rows = locate(cache[n]) if locate is not None else None
        sources[n] = PositionSource(rows.read if rows is not None else reader(n), rows.read if rows is not None else None)
        del obj
    shapes = {n: tuple(t.shape) for n, t in cache.items()}
    dtypes = {n: t.dtype for n, t in cache.items()}
    cache.clear()
    return _build(str(d), convention, sources, shapes, dtypes, _ids(ids, str(d)), num_layers, {})


def _single(obj: Any, f: Path, want_float: bool = True) -> Any:
    """The one array a per-position file holds (a bare tensor, or a dict/list with one)."""
    if _is_tensor(obj):
        return obj
    values = list(obj.values()) if isinstance(obj, dict) else list(obj) if isinstance(obj, (list, tuple)) else []
    tensors = [v for v in values if _is_tensor(v) and (is_float(v.dtype) if want_float else _is_int(v))]
    if len(tensors) != 1:
        raise ForensicsError(f"expected exactly one {'float' if want_float else 'integer'} tensor, found {len(tensors)}", path=f)
    return tensors[0]


def load_capture(
    path: str | Path, *, convention: str = "hf", num_layers: int | None = None, allow_unsafe: bool = False
) -> Capture:
    """Open a capture sweep lazily from a file or directory."""
    if convention not in CONVENTIONS:
        raise ForensicsError(f"unknown capture convention {convention!r}; choose one of {', '.join(CONVENTIONS)}")
    p = Path(path)
    if p.is_dir():
        return _from_directory(p, convention, num_layers, allow_unsafe)
    check_file(p)
    if sniff(p) == "safetensors":
        return _from_safetensors(p, convention, num_layers)
    obj = load_object(p, allow_unsafe=allow_unsafe, lazy=True)
    if isinstance(obj, (list, tuple)):
        cap = _from_sequence(list(obj), str(p), convention, None, num_layers, {})
    elif isinstance(obj, dict):
        cap = _from_mapping(obj, str(p), convention, num_layers)
    else:
        raise ForensicsError(f"holds a {type(obj).__name__}; expected a list of hidden states or a dict", path=p)
    return _stream_from_file(cap, p, obj) if allow_unsafe else cap


def _stream_from_file(cap: Capture, p: Path, obj: Any) -> Capture:
    """Let a memory-mapped .pt capture (``torch.load``, only with ``allow_unsafe``) have its rows read from
    the file instead (see ``filerows``); a capture read by ``torchfile`` reads its rows from the file already."""
    locate = file_locator(p, obj)
    if locate is None:
        return cap
    for pos, src in list(cap.readers.items()):
        rows = locate(src()) if isinstance(src, PositionSource) else None
        if rows is not None:
            cap.readers[pos] = src.with_rows(rows.read)
    return cap
