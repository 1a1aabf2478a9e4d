"""A CPU alignment never imports torch: safetensors / npz inputs (issue 15) and torch files, .pt / .ckpt /
.ckpt.gz / legacy (issue 23: start-up and memory).

Each check runs in a fresh interpreter where ``import torch`` is made to fail, so any module on
the path that still imports torch (at module level or inside a function it calls) breaks it.
"""
from __future__ import annotations

import json
import subprocess
import sys

from .realdata import ROOT, SAMPLES

BLOCK = "import sys\nsys.modules['torch'] = None  # any import of torch now raises ImportError\n"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def _cli_json(*args: str, block: bool) -> tuple[int, dict]:
    code = ("import runpy\nsys.argv = ['eagleforensics', *%r]\n"
            "try:\n    runpy.run_module('eagleforensics', run_name='__main__')\n"
            "except SystemExit as exc:\n    code = exc.code\n"
            "assert 'torch' not in sys.modules or sys.modules['torch'] is None\n"
            "sys.exit(code)\n") % (list(args),)
    res = subprocess.run([sys.executable, "-c", (BLOCK if block else "import sys\n") + code], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode in (0, 1), res.stderr[-2000:]
    return res.returncode, json.loads(res.stdout)


def _placed(doc: dict) -> list[tuple]:
    return [(m["name"], m["position"], m["post_norm"], m["confident"]) for m in doc["mapping"]]


def test_align_on_two_safetensors_files_runs_without_torch():
    """The CLI on the safetensors samples, torch made unimportable: same placements as the .pt record."""
    record = SAMPLES / "record_layer_outputs.safetensors"
    code, doc = _cli_json("align", str(record), str(SAMPLES / "capture_sweep.safetensors"), "--json", block=True)
    ref_code, ref = _cli_json("align", str(SAMPLES / "record_layer_outputs.pt"),
                              str(SAMPLES / "capture_sweep.safetensors"), "--json", block=False)
    assert code == ref_code == 1  # the incident record: ids must be written explicitly
    assert _placed(doc) == _placed(ref)
    assert [m["position"] for m in doc["mapping"]] == [3, 7, 10, 12]
    for a, b in zip(doc["mapping"], ref["mapping"]):
        assert abs(a["score"] - b["score"]) < 1e-6


def test_the_library_path_imports_no_torch():
    """Importing the pipeline and aligning arrays given in memory: no torch anywhere."""
    res = _run("from eagleforensics.alignment import align\n"
               "from eagleforensics.io.capture import load_capture\n"
               "r = align('data_samples/record_layer_outputs.safetensors', 'data_samples/capture_sweep.safetensors')\n"
               "print([m.position.p for m in r.matches])\n")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[3, 7, 10, 12]"


def test_a_module_that_imports_torch_is_caught(tmp_path):
    """The guard itself: with torch blocked, a module that imports it fails (so the checks above can fail)."""
    res = _run("import eagleforensics.evidence.gpu\n")
    assert res.returncode != 0 and "import of torch halted" in res.stderr


def test_align_on_ckpt_and_pt_files_runs_without_torch(tmp_path):
    """SpecForge's .ckpt (also gzipped and as a legacy save) against a .pt capture and a safetensors one,
    torch made unimportable: the sample's verdict (OK, the engines' default positions). That the arrays
    equal torch.load's is tests/test_torchfile.py's job."""
    import gzip

    import torch

    ckpt = SAMPLES / "data_0.ckpt"
    (tmp_path / "data_0.ckpt.gz").write_bytes(gzip.compress(ckpt.read_bytes()))
    torch.save(torch.load(ckpt, weights_only=True), tmp_path / "legacy.ckpt", _use_new_zipfile_serialization=False)
    for record in (ckpt, tmp_path / "data_0.ckpt.gz", tmp_path / "legacy.ckpt"):
        for capture in (SAMPLES / "capture.pt", SAMPLES / "capture_sweep.safetensors"):
            code, doc = _cli_json("align", str(record), str(capture), "--json", block=True)
            assert code == 0 and doc["level"] == "OK"
            assert [(m["position"], m["confident"]) for m in doc["mapping"]] == [(2, True), (6, True), (9, True),
                                                                              (12, True)]
