"""More input kinds for ``scripts/fuzz.py``: YAML and JSON draft configs, draft directories, server logs, nested archives.

Each ``KindCase`` starts from a real file of its kind (a TensorRT-LLM YAML and a SpecForge
config as tests/drafts.py writes them, a draft directory whose ``model.safetensors`` holds
a real ``fc.weight`` header, the engine log fixtures, a ``.ckpt.gz`` whose inner torch zip
stores its records deflated, an ``.npz`` of real token ids), applies byte edits and, for the
text kinds, hostile splices (anchors and aliases, deep nesting, a very long line), and runs
the reader the CLI uses. It ends as ``result`` or ``clean-error`` (a one-line ForensicsError),
anything else is a ``failure``.

Issue 19 adds (``ISSUE_19_KINDS``): the sample drafter directory and the sample target's shard
directory, one member edited (bytes, or the safetensors header's claims) or replaced by a
FIFO, the target without its index (every ``*.safetensors`` read), run through ``replay``;
report pages (the embedded result of a real alignment) with hostile splices and a FIFO, fed to
``read_report``; "stride tricks": safetensors headers whose shapes, offsets and dtypes claim
other layouts of the same bytes (reshaped, an empty dimension beside a huge one, aliased
offsets, fractions, 5000 digits), and ``.npy`` capture positions with other headers (empty
and huge, Fortran order, byte-swapped, records, sub-arrays, objects, format 3.0); fingerprints
whose sizes claim other models.
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
ISSUE_19_KINDS = ("drafter-dir", "target-dir", "report-page", "st-claims", "npy-claims", "fingerprint")
KINDS = ("yaml", "json", "draft-dir", "log", "log-gz", "nested-ckpt-gz", "npz") + ISSUE_19_KINDS
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
    fifo: bool = False  # draft-dir, drafter-dir, target-dir, report-page: the file is a FIFO
    member: str = ""  # directory kinds: the file that is edited (or is the FIFO)
    tweaks: tuple[tuple[Any, ...], ...] = ()  # structured edits of a header's claims (see ``apply_tweaks``)
    variant: str = ""  # target-dir "no-index": the shard index is removed

    @property
    def target(self) -> str:
        if self.member:
            return f"{self.kind}_{self.member}"
        return {"yaml": "extra_llm_api.yaml", "json": "config.json", "draft-dir": "model.safetensors",
                "log": "server.log", "log-gz": "server.log.gz", "nested-ckpt-gz": "data_0.ckpt.gz",
                "npz": "ids.npz", "report-page": "report.html", "st-claims": "capture_sweep.safetensors",
                "fingerprint": "capture.fp.json"}[self.kind]

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


def _report_page() -> bytes:
    """A page holding the embedded result of a real alignment, as insert_provenance writes it."""
    from eagleforensics.alignment import align
    from eagleforensics.report.provenance import collect, insert_embedded

    summary = align(SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture.pt").to_dict()
    record = collect([("capture", SAMPLES / "capture.pt")], command=["eagleforensics", "report"], hash_files=False)
    page = "<html><head><title>r</title></head><body><main><p>report</p></main></body></html>"
    return insert_embedded(page, {"summary": summary, "provenance": record}).encode()


def _fingerprint() -> bytes:
    from eagleforensics.evidence.fingerprint import make_fingerprint
    from eagleforensics.io.capture import load_capture

    return json.dumps(make_fingerprint(load_capture(SAMPLES / "capture.pt"))).encode()


BASES = {"yaml": _yaml, "json": _config, "draft-dir": _draft_safetensors, "report-page": _report_page,
         "st-claims": lambda: (SAMPLES / "capture_sweep.safetensors").read_bytes(), "fingerprint": _fingerprint,
         "drafter-dir": lambda: b"", "target-dir": lambda: b"", "npy-claims": lambda: b"",
         "log": lambda: (FIXTURES / "sglang_0.5.5_broken.log").read_bytes(),
         "log-gz": lambda: (FIXTURES / "vllm_0.33.log").read_bytes(),
         "nested-ckpt-gz": _nested_ckpt, "npz": _npz}
_CACHE: dict[str, bytes] = {}


def base(kind: str, member: str = "") -> bytes:
    key = f"{kind}/{member}"
    if key not in _CACHE:
        if kind in DIRS:
            _CACHE[key] = (DIRS[kind] / member).read_bytes()
        elif kind == "npy-claims":
            _CACHE[key] = _npy_layers()[member]
        else:
            _CACHE[key] = BASES[kind]()
    return _CACHE[key]


DIRS = {"drafter-dir": SAMPLES / "drafter", "target-dir": SAMPLES / "target"}
MEMBERS = {"drafter-dir": ("config.json", "model.safetensors"),
           "target-dir": ("config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                          "model-00002-of-00002.safetensors"),
           "npy-claims": tuple(f"layer_{i}.npy" for i in range(13)) + ("input_ids.npy",)}
REPORT_SPLICES = (
    b'<script type="application/json" id="eagleforensics-result">' * 2000, b"[" * 5000, b"{" * 70, b"</script>",
    b"9" * 5000, b"\xff\xfe", b"\\" * 1000, b'\\"' * 20000, b"<!--", b"\x00", b'"schema": 1e400, ',
)
CONFIG_SPLICES = (b"1e400", b"-1", b"9" * 5000, b"0.5", b"null", b'"x"', b"[" * 80, b"\x1b[2J\n", b"true",
                  b'"rope_scaling": {"rope_type": "llama3", "factor": 1e400}, ', b'"num_attention_heads": 1048576, ')
HUGE = 1 << 40
SHAPE_TRICKS = ("zero-huge", "huge-zero", "neg", "fraction", "inf", "text", "bool", "extra-dim", "flatten", "swap",
                "digits", "empty-list")
OFFSET_TRICKS = ("alias", "reverse", "shift", "huge", "fraction")
DTYPES = ("F16", "BF16", "F32", "F64", "U8", "I8", "I64", "U32", "BOOL", "F8_E4M3", "C64", "X")
META_TRICKS = ("string", "list", "nested", "number", "deep-string", "huge-layers")
NPY_TRICKS = ("zero-huge", "swap", "extra-dim", "flatten", "fortran", ">f4", "<f2", "<f8", "|u1", "<i8", "|b1",
              "<c8", "|V4", "record", "subarray", "object", "v3", "short-data")
FP_TRICKS = (("hidden_size", 0), ("hidden_size", -1), ("hidden_size", 1e400), ("hidden_size", HUGE),
             ("hidden_size", "x"), ("hidden_size", 1.5), ("num_tokens", HUGE), ("num_tokens", 0), ("sketch.k", HUGE),
             ("sketch.k", 4096), ("sketch.seed", -1), ("sketch.seed", 10 ** 30), ("num_layers", HUGE),
             ("num_layers", True), ("p", HUGE), ("p", -3), ("probe_rows.shape", [0, HUGE]),
             ("probe_rows.shape", [0, 1 << 19]), ("norms.shape", [HUGE]), ("input_ids", [HUGE * HUGE]),
             ("positions", []), ("positions", None), ("probe_tokens", [1e400]))


@st.composite
def kind_cases(draw: Any, max_edits: int = 3) -> KindCase:
    kind = draw(st.sampled_from(KINDS))
    member = draw(st.sampled_from(MEMBERS[kind])) if kind in MEMBERS else ""
    if kind == "npy-claims":
        tweaks = tuple(draw(st.lists(st.sampled_from(NPY_TRICKS), min_size=1, max_size=2)))
        return KindCase(kind, (), member=member, tweaks=tuple((t,) for t in tweaks))
    size = max(1, len(base(kind, member)))
    tweaks: tuple[tuple[Any, ...], ...] = ()
    if member.endswith(".safetensors") or kind == "st-claims":
        tweaks = tuple(draw(st.lists(st.one_of(
            st.tuples(st.just("shape"), st.integers(0, 31), st.sampled_from(SHAPE_TRICKS)),
            st.tuples(st.just("offsets"), st.integers(0, 31), st.sampled_from(OFFSET_TRICKS)),
            st.tuples(st.just("dtype"), st.integers(0, 31), st.sampled_from(DTYPES)),
            st.tuples(st.just("meta"), st.sampled_from(META_TRICKS))), max_size=2)))
    elif kind == "fingerprint":
        tweaks = tuple(draw(st.lists(st.sampled_from(FP_TRICKS), max_size=2)))
    ed = tuple(draw(st.one_of(st.just([]), edits(size, max_edits)))) if not tweaks or draw(st.booleans()) else ()
    splices: tuple[tuple[float, bytes], ...] = ()
    if kind in ("yaml", "json", "log", "log-gz"):
        splices = tuple(draw(st.lists(st.tuples(st.floats(0, 1), st.sampled_from(SPLICES)), max_size=3)))
    elif kind == "report-page":
        splices = tuple(draw(st.lists(st.tuples(st.floats(0, 1), st.sampled_from(REPORT_SPLICES)), max_size=3)))
    elif member.endswith(".json") or kind == "fingerprint":
        splices = tuple(draw(st.lists(st.tuples(st.floats(0, 1), st.sampled_from(CONFIG_SPLICES)), max_size=2)))
    fifo = kind in ("draft-dir", "drafter-dir", "target-dir", "report-page") and draw(st.integers(0, 9)) == 0
    variant = "no-index" if kind == "target-dir" and draw(st.integers(0, 3)) == 0 else ""
    return KindCase(kind, ed, splices, fifo, member, tweaks, variant)


def _npy_layers() -> dict[str, bytes]:
    """The sample capture as a directory of .npy files, one per position, plus input_ids.npy."""
    import numpy as np
    import torch

    cap = torch.load(SAMPLES / "capture.pt", weights_only=True)
    out = {}
    for i, h in enumerate(cap["hidden_states"]):
        buf = io.BytesIO()
        np.save(buf, h[0].float().numpy())
        out[f"layer_{i}.npy"] = buf.getvalue()
    buf = io.BytesIO()
    np.save(buf, cap["input_ids"].numpy())
    out["input_ids.npy"] = buf.getvalue()
    return out


def _set_raw(header: dict, key: str, field: str, raw: str) -> tuple[dict, dict[str, str]]:
    """Mark ``header[key][field]`` to be written as the raw JSON text ``raw`` (1e400, 5000 digits)."""
    token = f"@@RAW{len(key)}_{field}@@"
    header[key][field] = token
    return header, {json.dumps(token): raw}


def apply_tweaks(case: KindCase, data: bytes) -> bytes:
    """The structured edits of ``case`` applied to a safetensors header, an .npy header or a fingerprint."""
    if not case.tweaks:
        return data
    if case.kind == "npy-claims":
        return _npy_tweak(data, [t[0] for t in case.tweaks])
    if case.kind == "fingerprint":
        return _fp_tweak(data, case.tweaks)
    if len(data) < 8:
        return data
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + n])
    except ValueError:
        return data
    if not isinstance(header, dict):
        return data
    body = data[8 + n:]
    keys = [k for k in header if k != "__metadata__" and isinstance(header[k], dict)]
    raws: dict[str, str] = {}
    for tweak in case.tweaks:
        if tweak[0] == "meta":
            header["__metadata__"] = {"string": "eagleforensics", "list": [1, 2], "nested": {"a": {"b": "c"}},
                                      "number": {"eagleforensics": 3},
                                      "deep-string": {"eagleforensics": "[" * 5000 + "]" * 5000},
                                      "huge-layers": {"eagleforensics": '{"format": "eagleforensics-capture-v1", '
                                                                        '"num_hidden_layers": "99999999999"}'},
                                      }[tweak[1]]
            continue
        if not keys:
            continue
        key = keys[tweak[1] % len(keys)]
        info = header[key]
        shape = list(info.get("shape") or [1])
        if tweak[0] == "shape":
            trick = tweak[2]
            if trick in ("inf", "digits"):
                header, raw = _set_raw(header, key, "shape", "[1e400]" if trick == "inf" else "[" + "9" * 5000 + "]")
                raws.update(raw)
                continue
            import math

            dims = [d if isinstance(d, int) and not isinstance(d, bool) else 1 for d in shape]  # after another trick
            info["shape"] = {"zero-huge": lambda: [0, HUGE], "huge-zero": lambda: [HUGE, 0],
                             "neg": lambda: [-1] + dims[1:], "fraction": lambda: [dims[0] + 0.5] + dims[1:],
                             "text": lambda: [str(d) for d in dims], "bool": lambda: [True] + dims[1:],
                             "extra-dim": lambda: [1] + dims, "flatten": lambda: [math.prod(dims)],
                             "swap": lambda: dims[::-1], "empty-list": lambda: []}[trick]()
        elif tweak[0] == "offsets":
            offsets = info.get("data_offsets")
            start, end = offsets if isinstance(offsets, list) and len(offsets) == 2 and all(
                isinstance(x, int) for x in offsets) else (0, 0)
            other = header[keys[(tweak[1] + 1) % len(keys)]].get("data_offsets", [0, 0])
            info["data_offsets"] = {"alias": list(other), "reverse": [end, start], "shift": [start + 2, end + 2],
                                    "huge": [start, HUGE], "fraction": [start + 0.5, end]}[tweak[2]]
        elif tweak[0] == "dtype":
            info["dtype"] = tweak[2]
    raw = json.dumps(header)
    for token, text in raws.items():
        raw = raw.replace(token, text)
    head = raw.encode()
    return struct.pack("<Q", len(head)) + head + body


def _npy_tweak(data: bytes, tricks: list[str]) -> bytes:
    """An .npy with its header rewritten by ``tricks`` (the data bytes kept, or cut for short-data)."""
    import ast

    hlen = struct.unpack("<H", data[8:10])[0]
    header = ast.literal_eval(data[10:10 + hlen].decode("latin1"))
    body = data[10 + hlen:]
    descr, fortran, shape = header["descr"], header["fortran_order"], list(header["shape"])
    version = b"\x01\x00"
    for trick in tricks:
        if trick == "zero-huge":
            shape = [0, HUGE]
        elif trick == "swap":
            shape = shape[::-1]
        elif trick == "extra-dim":
            shape = [1] + shape
        elif trick == "flatten":
            import math

            shape = [math.prod(shape)]
        elif trick == "fortran":
            fortran = True
        elif trick == "record":
            descr = [("a", "<f4")]
        elif trick == "subarray":
            descr = [("a", "<f4", (1 << 28,))]
        elif trick == "object":
            descr = "|O"
        elif trick == "v3":
            version = b"\x03\x00"
        elif trick == "short-data":
            body = body[: len(body) // 2]
        else:
            descr = trick
    text = "{'descr': %r, 'fortran_order': %r, 'shape': %r, }" % (descr, fortran, tuple(shape))
    text += " " * (63 - (len(text) + 10) % 64) + "\n"
    if version == b"\x03\x00":
        return b"\x93NUMPY" + version + struct.pack("<I", len(text)) + text.encode() + body
    return b"\x93NUMPY" + version + struct.pack("<H", len(text)) + text.encode() + body


def _fp_tweak(data: bytes, tweaks: tuple[tuple[Any, ...], ...]) -> bytes:
    """A fingerprint whose sizes or positions claim something else (``FP_TRICKS``)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return data
    if not isinstance(doc, dict):
        return data
    raws = {}
    for field, value in tweaks:
        token = f"@@{field}@@"
        shown = token if isinstance(value, float) and value == float("inf") else value
        if isinstance(value, float) and value == float("inf"):
            raws[json.dumps(token)] = "1e400"
        if field.startswith("sketch."):
            if isinstance(doc.get("sketch"), dict):
                doc["sketch"][field[7:]] = shown
        elif field in ("p", "probe_rows.shape", "norms.shape"):
            for e in doc.get("positions") or []:
                if isinstance(e, dict):
                    if field == "p":
                        e["p"] = shown
                    elif isinstance(e.get(field.split(".")[0]), dict):
                        e[field.split(".")[0]]["shape"] = shown
        else:
            doc[field] = shown
    text = json.dumps(doc)
    for token, raw in raws.items():
        text = text.replace(token, raw)
    return text.encode()


def mutated(case: KindCase) -> bytes:
    data = apply_edits(apply_tweaks(case, base(case.kind, case.member)), list(case.edits))
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
    if case.kind in DIRS or case.kind == "npy-claims":
        return _write_dir(case, scratch, target)
    if case.kind == "report-page" and case.fifo:
        page = scratch / "page.html"
        if page.exists() or page.is_symlink():
            page.unlink()
        os.mkfifo(page)
        target.write_bytes(b"(a FIFO)")
        return page
    if case.kind == "draft-dir":
        d = scratch / "draft"
        d.mkdir(exist_ok=True)
        (d / "config.json").write_bytes(_config())
        _fill(d / "model.safetensors", case, target)
        return d
    target.write_bytes(mutated(case))
    return target


def _write_dir(case: KindCase, scratch: Path, target: Path) -> Path:
    """A fresh copy of the case's directory (drafter, target, .npy capture) with its member mutated or a FIFO."""
    import shutil

    d = scratch / case.kind
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    names = MEMBERS[case.kind]
    for name in names:
        (d / name).write_bytes(base(case.kind, name))
    if case.variant == "no-index":
        (d / "model.safetensors.index.json").unlink()
    _fill(d / case.member, case, target)
    return d


def _fill(inside: Path, case: KindCase, target: Path) -> None:
    """Put the case's mutated bytes (or a FIFO) at ``inside``, and a copy of what went there at ``target``."""
    if inside.exists() or inside.is_symlink():
        inside.unlink()
    if case.fifo:
        os.mkfifo(inside)
        target.write_bytes(b"(a FIFO)")
    else:
        data = mutated(case)
        inside.write_bytes(data)
        target.write_bytes(data)


def run(case: KindCase, scratch: Path) -> tuple[str, str, str]:
    """(kind, detail, signature) after running the CLI's reader for this input kind."""
    from eagleforensics.engines.draftconfig import audit_config
    from eagleforensics.engines.logs import parse_log
    from eagleforensics.errors import ForensicsError
    from eagleforensics.io.safeload import load_object
    from eagleforensics.io.training import load_training

    from eagleforensics.alignment import align
    from eagleforensics.report.provenance import read_report
    from eagleforensics.replay import run_replay

    path = write(case, scratch)
    try:
        if case.kind == "drafter-dir":
            run_replay(path, SAMPLES / "capture.pt", target=SAMPLES / "target", max_tokens=8).to_text()
        elif case.kind == "target-dir":
            run_replay(SAMPLES / "drafter", SAMPLES / "capture.pt", target=path, max_tokens=8).to_text()
        elif case.kind == "report-page":
            read_report(path)
        elif case.kind in ("st-claims", "npy-claims", "fingerprint"):
            align(SAMPLES / "record_layer_outputs.pt", path).to_text()
        elif case.kind == "yaml":
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
    except OSError as exc:  # the OS refusing a named path (a name too long): the CLI's one line (errors.path_error)
        from eagleforensics.errors import path_error

        bad = path_error(exc)
        return ("clean-error", str(bad), "") if bad is not None else _failure(case, exc)
    except Exception as exc:  # noqa: BLE001 - anything that is not a clean end is what the fuzzer looks for
        return _failure(case, exc)
    return "result", case.kind, ""


def _failure(case: KindCase, exc: BaseException) -> tuple[str, str, str]:
    """A ``failure`` entry whose signature names the kind, the exception type and the innermost line of ours."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb) if "eagleforensics" in f.filename), "?")
    return ("failure", f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
            f"{case.kind}: {type(exc).__name__} at {where}")
