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


# docs/errors.md rows whose tests live in tests/test_hardening.py (the catalogue test checks both ways)
CATALOGUE_IDS = {"output-is-input", "not-a-results-file", "not-a-regular-file", "yaml-alias-bomb", "log-line-too-long",
                 "decompression-bomb", "truncated-zip", "nested-too-deep", "control-characters", "disk-full",
                 "interrupted"}

BUILDERS: list[Callable[[Path], Case]] = [
    report_into_capture_dir, report_over_hard_link, scan_output_is_reference, scan_resume_other_file,
    fifo_in_draft_dir, fifo_in_draft_dir_align, yaml_alias_bomb, log_gz_long_line, npz_bomb,
    npz_truncated_member, ckpt_gz_inner_bomb, deep_json_config, deep_yaml_config, deep_safetensors_header,
    deep_fingerprint, escape_in_file_name,
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
