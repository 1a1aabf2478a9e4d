"""Hostile inputs from issue 13, built from the real samples: each returns the CLI arguments to run.

Shared by tests/test_hardening.py, tests/test_errors.py (catalogue rows), scripts/fuzz.py (new
input kinds) and scripts/hostile_inputs.py (which runs each one as a real process and prints
the line, the exit code and the peak memory). Builders are cheap: bombs are written in
chunks, so building one never needs the memory the bomb would take.
"""
from __future__ import annotations

import gzip
import io
import os
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .drafts import specforge_draft
from .realdata import SAMPLES

REC, CAP, SWEEP, CKPT = (SAMPLES / n for n in
                         ("record_layer_outputs.pt", "capture.pt", "capture_sweep.safetensors", "data_0.ckpt"))
FIXTURES = Path(__file__).parent / "fixtures" / "logs"
BOMB_BYTES = 80 * 1024 * 1024  # what the bombs below expand to: past the ratio floor (64 MiB), far under any RAM
DEPTH = 50_000  # nesting of the deep JSON/YAML inputs (Python's recursion limit is 1000)


@dataclass
class Case:
    """One hostile input: the CLI arguments, what the one line must say, the user's files that must not change."""

    id: str
    args: list[str]
    expect: tuple[str, ...]
    watch: list[Path] = field(default_factory=list)


def _zeros_member(zf: zipfile.ZipFile, name: str, header: bytes, size: int) -> None:
    """A deflated zip member of ``header`` then zeros up to ``size`` bytes, streamed (no big buffer)."""
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    with zf.open(info, "w", force_zip64=True) as fh:
        fh.write(header)
        chunk = bytes(1 << 20)
        left = size - len(header)
        while left > 0:
            fh.write(chunk[:min(left, len(chunk))])
            left -= len(chunk)


def _npy_header(n: int) -> bytes:
    head = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % n
    head += " " * (63 - (len(head) + 10) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode()


def npz_bomb(d: Path) -> Case:
    """A ~200 KiB .npz whose one float32 member inflates to 200 MiB (a deflate bomb), as --input-ids."""
    p = d / "ids.npz"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        header = _npy_header(BOMB_BYTES // 4)
        _zeros_member(zf, "input_ids.npy", header, BOMB_BYTES // 4 * 4 + len(header))
    return Case("decompression-bomb", ["capture", str(d / "model"), "--input-ids", str(p), "-o", str(d / "o.safetensors")],
                ("ids.npz", "decompression bomb"), [p])


def npz_truncated_member(d: Path) -> Case:
    """A real npz whose member's deflate stream is cut short (the zip directory still intact)."""
    p = d / "ids_cut.npz"
    ids = torch.load(CAP, weights_only=True)["input_ids"].numpy()
    buf = io.BytesIO()
    import numpy as np

    rng = np.random.default_rng(0)
    np.savez_compressed(buf, input_ids=rng.integers(0, int(ids.max()) + 1, 20_000))
    raw = bytearray(buf.getvalue())
    # zero the middle of the member's deflate data: the zip directory survives, inflating fails
    start = raw.index(b"input_ids.npy") + len("input_ids.npy")
    assert len(raw) > start + 5000
    raw[start + 2000:start + 2300] = bytes(300)
    p.write_bytes(bytes(raw))
    return Case("truncated-zip", ["capture", str(d / "model"), "--input-ids", str(p), "-o", str(d / "o.safetensors")],
                ("ids_cut.npz", "truncated or corrupt"), [p])


def ckpt_gz_inner_bomb(d: Path) -> Case:
    """A .ckpt.gz whose torch zip stores its tensor record deflated: 200 MiB inside a few hundred KiB."""
    small = io.BytesIO()
    torch.save({"hidden_state": torch.zeros(1, 4, 8)}, small)
    src = zipfile.ZipFile(io.BytesIO(small.getvalue()))
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for info in src.infolist():
            if "/data/" in info.filename:
                _zeros_member(zf, info.filename, b"", BOMB_BYTES)
            else:
                zf.writestr(info.filename, src.read(info.filename))
    p = d / "data_0.ckpt.gz"
    p.write_bytes(gzip.compress(inner.getvalue(), mtime=0))
    return Case("decompression-bomb", ["align", str(p), str(CAP)], ("data_0.ckpt.gz", "decompression bomb"), [p])


def yaml_alias_bomb(d: Path) -> Case:
    """A TensorRT-LLM YAML of a few hundred bytes whose aliases expand to 9^9 values."""
    lines = ["speculative_config:", "  decoding_type: Eagle", '  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        lines.append(f"  a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    lines.append("  eagle3_layers_to_capture: *a8")
    p = d / "extra_llm_api.yaml"
    p.write_text("\n".join(lines) + "\n")
    return Case("yaml-alias-bomb", ["config", str(p), "--engine", "trtllm", "--num-layers", "32"],
                ("extra_llm_api.yaml", "alias bomb"), [p])


def fifo_in_draft_dir(d: Path) -> Case:
    """A draft directory whose model.safetensors is a FIFO (opening it for reading would block forever)."""
    draft = specforge_draft(d, [2, 16, 29], name="draft", hidden=4096)
    os.mkfifo(draft / "model.safetensors")
    return Case("not-a-regular-file", ["config", str(draft), "--engine", "sglang", "--num-layers", "32"],
                ("model.safetensors", "is not a regular file"), [draft / "config.json"])


def fifo_in_draft_dir_align(d: Path) -> Case:
    case = fifo_in_draft_dir(d)
    return Case(case.id, ["align", str(REC), str(CAP), "--engine", "sglang", "--draft-config", case.args[1]],
                case.expect, case.watch)


def log_gz_long_line(d: Path) -> Case:
    """A .log.gz of ~200 KiB holding one 200 MiB line without a newline."""
    p = d / "server.log.gz"
    with gzip.GzipFile(p, "wb", compresslevel=9, mtime=0) as fh:
        chunk = b"a" * (1 << 20)
        for _ in range(BOMB_BYTES >> 20):
            fh.write(chunk)
    return Case("log-line-too-long", ["logs", f"run={p}"], ("server.log.gz", "longer than"), [p])


def deep_json_config(d: Path) -> Case:
    draft = d / "deep"
    draft.mkdir()
    (draft / "config.json").write_text('{"eagle_config": ' + "[" * DEPTH + "]" * DEPTH + "}")
    return Case("nested-too-deep", ["config", str(draft), "--engine", "sglang", "--num-layers", "32"],
                ("config.json", "nested", "deep"), [draft / "config.json"])


def deep_yaml_config(d: Path) -> Case:
    p = d / "deep.yaml"
    p.write_text("speculative_config: " + "[" * DEPTH + "]" * DEPTH + "\n")
    return Case("nested-too-deep", ["config", str(p), "--engine", "trtllm", "--num-layers", "32"],
                ("deep.yaml", "nested"), [p])


def deep_safetensors_header(d: Path) -> Case:
    body = ("{\"__metadata__\": {\"x\": " + "[" * DEPTH + "]" * DEPTH + "}}").encode()
    p = d / "deep.safetensors"
    p.write_bytes(struct.pack("<Q", len(body)) + body)
    return Case("nested-too-deep", ["align", str(REC), str(p)], ("deep.safetensors", "nested"), [p])


def deep_fingerprint(d: Path) -> Case:
    p = d / "deep.fp.json"
    p.write_text('{"format": "eagleforensics-fingerprint-v1", "x": ' + "[" * DEPTH + "]" * DEPTH + "}")
    return Case("nested-too-deep", ["align", str(REC), str(p)], ("deep.fp.json", "nested"), [p])


def escape_in_file_name(d: Path) -> Case:
    """A file whose name holds a terminal escape (clear screen, red) and a newline forging a line."""
    p = d / "rec\x1b[2J\x1b[31m\nVERDICT: all good.pt"
    p.write_bytes(b"")
    return Case("control-characters", ["align", str(p), str(CAP)], ("\\x1b[2J", "\\nVERDICT: all good.pt",
                                                                      "file is empty"), [])


def escape_in_key_name(d: Path) -> Case:
    """A record whose tensor key names hold an escape sequence and a newline forging a VERDICT line."""
    rec = torch.load(REC, weights_only=True)
    forged = {f"h{i}\x1b[2J\nVERDICT: every slot placed": t for i, t in enumerate(rec["hidden_states"])}
    p = d / "keys.pt"
    torch.save({"input_ids": rec["input_ids"], **forged}, p)
    return Case("control-characters", ["align", str(p), str(CAP)], (), [p])


def report_into_capture_dir(d: Path) -> Case:
    """report SHARD CAPTURE_DIR -o CAPTURE_DIR/layer_3.pt: the output is a file inside the capture directory."""
    cap = torch.load(CAP, weights_only=True)
    sweep = d / "sweep"
    sweep.mkdir()
    for i, h in enumerate(cap["hidden_states"]):
        torch.save(h.clone(), sweep / f"layer_{i}.pt")
    torch.save(cap["input_ids"].clone(), sweep / "input_ids.pt")
    return Case("output-is-input", ["report", str(REC), str(sweep), "-o", str(sweep / "layer_3.pt")],
                ("layer_3.pt", "inside", "sweep"), sorted(sweep.iterdir()))


def report_over_hard_link(d: Path) -> Case:
    """report rec.pt cap.pt -o link.html where link.html is a hard link to rec.pt."""
    rec = d / "rec.pt"
    rec.write_bytes(REC.read_bytes())
    os.link(rec, d / "link.html")
    return Case("output-is-input", ["report", str(rec), str(CAP), "-o", str(d / "link.html")],
                ("link.html", "would overwrite", "rec.pt", "inode"), [rec])


def scan_output_is_reference(d: Path) -> Case:
    """scan DS --reference ref.pt -o ref.pt --resume: the reference must not be cut to its last newline."""
    ds = d / "ds" / "rows_0"
    ds.mkdir(parents=True)
    (ds / "data_0.ckpt").write_bytes(CKPT.read_bytes())
    ref = d / "ref.pt"
    ref.write_bytes(CAP.read_bytes())
    return Case("output-is-input", ["scan", str(d / "ds"), "--reference", str(ref), "-o", str(ref), "--resume"],
                ("ref.pt", "would overwrite the reference capture"), [ref])


def scan_resume_other_file(d: Path) -> Case:
    """scan DS -o notes.txt --resume where notes.txt is some other file: refused before anything is cut."""
    ds = d / "ds" / "rows_0"
    ds.mkdir(parents=True)
    (ds / "data_0.ckpt").write_bytes(CKPT.read_bytes())
    notes = d / "notes.txt"
    notes.write_bytes(b"first line\nsecond line without newline")
    return Case("not-a-results-file", ["scan", str(d / "ds"), "-o", str(notes), "--resume"],
                ("notes.txt", "not a scan results file"), [notes])


# ---------------------------------------------------------------- issue 19: hangs, claims, numbers

DRAFTER, TARGET, SWEEP_ST = SAMPLES / "drafter", SAMPLES / "target", SAMPLES / "capture_sweep.safetensors"
REC_ST = SAMPLES / "record_layer_outputs.safetensors"


def st_header(path: Path) -> tuple[dict, bytes]:
    """A safetensors file's header (parsed) and its data section."""
    import json

    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def st_write(path: Path, header: dict | bytes, data: bytes) -> Path:
    """A safetensors file of ``header`` (a dict, or the exact JSON bytes) and ``data``."""
    import json

    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def _copy_dir(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def fifo_model_safetensors_in_drafter(d: Path) -> Case:
    """replay DRAFTER: model.safetensors is a FIFO (it used to reach the *.safetensors fallback and hang)."""
    draft = d / "drafter"
    draft.mkdir()
    (draft / "config.json").write_bytes((DRAFTER / "config.json").read_bytes())
    os.mkfifo(draft / "model.safetensors")
    return Case("not-a-regular-file", ["replay", str(draft), str(CAP), "--target", str(TARGET)],
                ("model.safetensors", "is not a regular file"), [draft / "config.json"])


def fifo_shard_in_target(d: Path) -> Case:
    """replay --target: the shard the index names for lm_head is a FIFO."""
    target = _copy_dir(TARGET, d / "target")
    shard = target / "model-00002-of-00002.safetensors"
    shard.unlink()
    os.mkfifo(shard)
    return Case("not-a-regular-file", ["replay", str(DRAFTER), str(CAP), "--target", str(target)],
                ("model-00002-of-00002.safetensors", "is not a regular file"), [target / "config.json"])


def fifo_safetensors_in_unindexed_target(d: Path) -> Case:
    """replay --target: no index and no model.safetensors, so every *.safetensors is read; one is a FIFO."""
    target = _copy_dir(TARGET, d / "target")
    (target / "model.safetensors.index.json").unlink()
    os.mkfifo(target / "extra.safetensors")
    return Case("not-a-regular-file", ["replay", str(DRAFTER), str(CAP), "--target", str(target)],
                ("extra.safetensors", "is not a regular file"), [target / "config.json"])


def fifo_in_model_dir(d: Path) -> Case:
    """capture MODEL_DIR: a FIFO among the files transformers opens by name."""
    model = d / "fifo_model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    os.mkfifo(model / "model.safetensors")
    return Case("not-a-regular-file", ["capture", str(model), "--input-ids", "1,2", "-o", str(d / "o.safetensors")],
                ("model.safetensors", "is not a regular file"), [model / "config.json"])


def _sweep_with(d: Path, name: str, edit: Callable[[dict], object]) -> Path:
    header, data = st_header(SWEEP_ST)
    edit(header)
    return st_write(d / name, header, data)


def metadata_is_a_string(d: Path) -> Case:
    p = _sweep_with(d, "meta_str.safetensors", lambda h: h.__setitem__("__metadata__", "eagleforensics"))
    return Case("not-a-number", ["align", str(REC), str(p)], ("meta_str.safetensors", "__metadata__"), [p])


def metadata_is_a_list(d: Path) -> Case:
    p = _sweep_with(d, "meta_list.safetensors", lambda h: h.__setitem__("__metadata__", [1, 2]))
    return Case("not-a-number", ["align", str(REC), str(p)], ("meta_list.safetensors", "__metadata__"), [p])


def metadata_string_nested_deep(d: Path) -> Case:
    """The capture helper's metadata string holds JSON nested 50,000 deep (json.loads overflowed the stack)."""
    p = _sweep_with(d, "meta_deep.safetensors", lambda h: h["__metadata__"].__setitem__(
        "eagleforensics", "[" * DEPTH + "]" * DEPTH))
    return Case("nested-too-deep", ["align", str(REC), str(p)], ("meta_deep.safetensors", "nested"), [p])


def metadata_layers_infinite(d: Path) -> Case:
    """The capture helper's metadata claims num_hidden_layers 1e400 (int(inf) raised OverflowError)."""
    p = _sweep_with(d, "meta_inf.safetensors", lambda h: h["__metadata__"].__setitem__(
        "eagleforensics", '{"format": "eagleforensics-capture-v1", "num_hidden_layers": 1e400}'))
    return Case("not-a-number", ["align", str(REC), str(p)], ("meta_inf.safetensors", "metadata"), [p])


def shape_not_integer(d: Path) -> Case:
    """A shape of 1e400 (JSON reads it as inf): int(inf) raised OverflowError."""
    header, data = st_header(REC_ST)
    raw = json_bytes(header).replace(b'"shape": [1, 64, 128]', b'"shape": [1e400, 64, 128]', 1)
    assert b"1e400" in raw
    p = st_write(d / "shape_inf.safetensors", raw, data)
    return Case("not-a-number", ["align", str(p), str(CAP)], ("shape_inf.safetensors", "not a whole number"), [p])


def shape_fraction(d: Path) -> Case:
    """A shape of 1.5 was read as 1 (int() truncates) and, when the bytes happened to fit, accepted."""
    header, data = st_header(REC_ST)
    key = next(k for k in header if k.startswith("hidden_states"))
    header[key]["shape"] = [1.0 if i == 0 else dim for i, dim in enumerate(header[key]["shape"])]
    p = st_write(d / "shape_float.safetensors", header, data)
    return Case("not-a-number", ["align", str(p), str(CAP)], ("shape_float.safetensors", "not a whole number"), [p])


def number_of_5000_digits(d: Path) -> Case:
    """A data offset of 5000 digits: json.loads raised ValueError (Python's int digit limit)."""
    header, data = st_header(REC_ST)
    raw = json_bytes(header).replace(b'"data_offsets": [0,', b'"data_offsets": [' + b"9" * 5000 + b",", 1)
    p = st_write(d / "digits.safetensors", raw, data)
    return Case("not-a-number", ["align", str(p), str(CAP)], ("digits.safetensors", "not valid JSON"), [p])


def empty_tensor_huge_dimension(d: Path) -> Case:
    """An empty tensor [0, 2^40] holds no bytes, so nothing bounded the 2^40 a reader would size by."""
    header, data = st_header(SWEEP_ST)
    header["extra"] = {"dtype": "F32", "shape": [0, 1 << 40], "data_offsets": [len(data), len(data)]}
    p = st_write(d / "empty_dim.safetensors", header, data)
    return Case("absurd-size", ["align", str(REC), str(p)], ("empty_dim.safetensors", "no elements"), [p])


def key_claims_position_10_to_12(d: Path) -> Case:
    """A capture key 'layer_111111111111' sized a list of 10^12 positions (MemoryError)."""
    from safetensors.numpy import save_file

    cap = torch.load(CAP, weights_only=True)
    tensors = {f"layer_{i}": h[0].float().numpy() for i, h in enumerate(cap["hidden_states"])}
    tensors["layer_111111111111"] = tensors["layer_0"]
    tensors["input_ids"] = cap["input_ids"].numpy()
    p = d / "big_key.safetensors"
    save_file(tensors, str(p))
    return Case("not-a-number", ["align", str(REC), str(p)], ("big_key.safetensors", "claims position"), [p])


def fingerprint_claims_wide_model(d: Path) -> Case:
    """A real fingerprint whose hidden_size says 10^7: the 10^7 x 64 projection was built before any check (GBs)."""
    import json

    from eagleforensics.evidence.fingerprint import make_fingerprint, write_fingerprint
    from eagleforensics.io.capture import load_capture

    p = write_fingerprint(make_fingerprint(load_capture(CAP)), d / "wide.fp.json")
    doc = json.loads(p.read_text())
    doc["hidden_size"] = 10_000_000
    p.write_text(json.dumps(doc))
    return Case("absurd-size", ["align", str(REC), str(p)], ("wide.fp.json", "wrong shape"), [p])


def fingerprint_empty_probes_wide(d: Path) -> Case:
    """No probe rows ([0, H]) leave H unbounded by bytes: hidden_size 2^20 with k 4096 claims a 2^32 projection."""
    import json

    from eagleforensics.evidence.fingerprint import make_fingerprint, write_fingerprint
    from eagleforensics.io.capture import load_capture

    p = write_fingerprint(make_fingerprint(load_capture(CAP), probes=0), d / "noprobe.fp.json")
    doc = json.loads(p.read_text())
    doc["hidden_size"] = 1 << 20
    for e in doc["positions"]:
        e["probe_rows"]["shape"] = [0, 1 << 20]
    p.write_text(json.dumps(doc))
    return Case("absurd-size", ["align", str(REC), str(p)], ("noprobe.fp.json", "projection"), [p])


def config_claims_huge_vocab(d: Path) -> Case:
    """capture MODEL_DIR: a real tiny checkpoint whose config.json says vocab_size 5*10^7 (GBs allocated)."""
    import json

    from eagleforensics.testing.tinymodels import build_model

    model = d / "tiny"
    build_model("llama", num_layers=2, hidden=64, seed=0).save_pretrained(str(model))
    cfg = json.loads((model / "config.json").read_text())
    cfg["vocab_size"] = 50_000_000
    (model / "config.json").write_text(json.dumps(cfg))
    return Case("absurd-size", ["capture", str(model), "--input-ids", "1,2", "-o", str(d / "o.safetensors")],
                ("tiny", "config.json"), [model / "config.json", model / "model.safetensors"])


def wiring_superscript(d: Path) -> Case:
    return Case("not-a-number", ["replay", str(DRAFTER), str(CAP), "--target", str(TARGET), "--wiring", "p\u00b2"],
                ("--wiring", "is not a position"))


def input_ids_superscript(d: Path) -> Case:
    return Case("not-a-number", ["capture", str(d / "model"), "--input-ids", "1,\u00b2", "-o", str(d / "o.safetensors")],
                ("--input-ids", "is not a token id"))


def input_id_past_int64(d: Path) -> Case:
    return Case("not-a-number", ["capture", str(d / "model"), "--input-ids", "1,99999999999999999999", "-o",
                                 str(d / "o.safetensors")], ("--input-ids", "below 2^63"))


def npy_of_records(d: Path) -> Case:
    """An .npy of a sub-array dtype: shape (0,) holds nothing, yet each element claims 2^28 values."""
    head = "{'descr': [('a', '<f4', (268435456,))], 'fortran_order': False, 'shape': (0,), }"
    head += " " * (63 - (len(head) + 10) % 64) + "\n"
    p = d / "ids.npy"
    p.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode())
    return Case("absurd-size", ["capture", str(d / "model"), "--input-ids", str(p), "-o", str(d / "o.safetensors")],
                ("ids.npy", "records or sub-arrays"), [p])


def quadratic_json_header(d: Path) -> Case:
    """A safetensors header of 600 KB of \\" in an unterminated string: the nesting check's regex took minutes."""
    bait = b'{"__metadata__": {"a": "' + b'\\"' * 300_000
    p = st_write(d / "slow.safetensors", bait, b"")
    return Case("absurd-size", ["align", str(REC), str(p)], ("slow.safetensors", "corrupt safetensors header"), [p])


def json_bytes(header: dict) -> bytes:
    import json

    return json.dumps(header).encode()


def output_is_a_fifo_scan(d: Path) -> Case:
    """scan -o FIFO: opening the results file for writing waited for a reader for ever."""
    ds = d / "ds" / "rows_0"
    ds.mkdir(parents=True)
    (ds / "data_0.ckpt").write_bytes(CKPT.read_bytes())
    os.mkfifo(d / "results.fifo")
    return Case("not-a-regular-file", ["scan", str(d / "ds"), "-o", str(d / "results.fifo"), "--workers", "1"],
                ("results.fifo", "is not a regular file"), [ds / "data_0.ckpt"])


def output_is_a_fifo_fingerprint(d: Path) -> Case:
    """fingerprint -o FIFO: the finished file was renamed onto the FIFO (as root, -o /dev/null replaced the device)."""
    os.mkfifo(d / "out.fifo")
    return Case("not-a-regular-file", ["fingerprint", str(CAP), "-o", str(d / "out.fifo")],
                ("out.fifo", "is not a regular file"), [])


def name_too_long(d: Path) -> Case:
    """A path of 5000 characters: Path.exists() raises (ENAMETOOLONG) instead of answering False."""
    return Case("unusable-path", ["align", "a" * 5000, str(CAP)], ("aaaa...", "cannot be used: File name too long"))


def shard_name_too_long(d: Path) -> Case:
    """Found by scripts/fuzz.py: a target's shard index naming a shard of 5000 characters."""
    import json

    target = _copy_dir(TARGET, d / "target")
    index = target / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"] = {k: ("m" * 5000 + ".safetensors") for k in doc["weight_map"]}
    index.write_text(json.dumps(doc))
    return Case("unusable-path", ["replay", str(DRAFTER), str(CAP), "--target", str(target)],
                ("mmmm...", "cannot be used: File name too long"), [index])


# builders whose old behaviour is a hang or gigabytes: run as a process (timeout, peak memory) in the tests
AS_PROCESS = {"fifo_model_safetensors_in_drafter", "fifo_shard_in_target", "fifo_safetensors_in_unindexed_target",
              "fifo_in_model_dir", "fifo_in_draft_dir", "fifo_in_draft_dir_align", "fingerprint_claims_wide_model",
              "fingerprint_empty_probes_wide", "config_claims_huge_vocab", "key_claims_position_10_to_12",
              "quadratic_json_header", "output_is_a_fifo_scan"}
ISSUE_19 = [fifo_model_safetensors_in_drafter, fifo_shard_in_target, fifo_safetensors_in_unindexed_target,
            fifo_in_model_dir, metadata_is_a_string, metadata_is_a_list, metadata_string_nested_deep,
            metadata_layers_infinite, shape_not_integer, shape_fraction, number_of_5000_digits,
            empty_tensor_huge_dimension, key_claims_position_10_to_12, fingerprint_claims_wide_model,
            fingerprint_empty_probes_wide, config_claims_huge_vocab, wiring_superscript, input_ids_superscript,
            input_id_past_int64, npy_of_records, quadratic_json_header, output_is_a_fifo_scan,
            output_is_a_fifo_fingerprint, name_too_long, shard_name_too_long]


# docs/errors.md rows whose tests live in tests/test_hardening.py (the catalogue test checks both ways)
CATALOGUE_IDS = {"output-is-input", "not-a-results-file", "not-a-regular-file", "yaml-alias-bomb", "log-line-too-long",
                 "decompression-bomb", "truncated-zip", "nested-too-deep", "control-characters", "disk-full",
                 "interrupted", "not-a-number", "absurd-size", "unusable-path"}

BUILDERS: list[Callable[[Path], Case]] = [
    report_into_capture_dir, report_over_hard_link, scan_output_is_reference, scan_resume_other_file,
    fifo_in_draft_dir, fifo_in_draft_dir_align, yaml_alias_bomb, log_gz_long_line, npz_bomb,
    npz_truncated_member, ckpt_gz_inner_bomb, deep_json_config, deep_yaml_config, deep_safetensors_header,
    deep_fingerprint, escape_in_file_name, *ISSUE_19,
]


def prepare(d: Path) -> Path:
    """A case folder with the empty ``model`` directory ``capture`` expects (refused before it is read)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "model").mkdir(exist_ok=True)
    return d


def fingerprint_of(paths: list[Path]) -> dict[str, tuple[bytes, int, int]]:
    """(bytes digest, size, mtime_ns) of each watched file."""
    import hashlib

    out = {}
    for p in paths:
        st = p.stat()
        out[str(p)] = (hashlib.sha256(p.read_bytes()).digest(), st.st_size, st.st_mtime_ns)
    return out
