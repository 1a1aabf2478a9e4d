"""data_samples/ is what scripts/make_samples.py writes, by what matters on any CPU, and stays small.

Byte-for-byte regeneration held only on the CPU the samples were made on: a forward pass's float
values depend on the vector path, so another machine of the same kind wrote other last bits
(tests/samplecheck.py says what is compared instead).
"""
from __future__ import annotations

import subprocess
import sys

import torch

from .realdata import ROOT, SAMPLES
from .samplecheck import compare_samples, nudge_last_bits


def test_samples_regenerate_the_same_on_this_cpu(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_samples.py"), str(tmp_path)], check=True)
    assert compare_samples(tmp_path, SAMPLES) == []


def test_another_cpus_last_bits_still_match(tmp_path):
    """What another vector path writes (5% of the float values one unit in the last place off) is the same samples."""
    nudge_last_bits(SAMPLES, tmp_path)
    assert (tmp_path / "capture.pt").read_bytes() != (SAMPLES / "capture.pt").read_bytes()  # not byte for byte
    assert compare_samples(tmp_path, SAMPLES) == []


def test_a_real_change_is_still_caught(tmp_path):
    """Another layer in a slot, a dtype, a token id, a key: each is a difference, and the slot's verdict moves."""
    nudge_last_bits(SAMPLES, tmp_path)
    rec = torch.load(tmp_path / "record_wrong_fix.pt", weights_only=True)
    rec["hidden_states"][1] = rec["hidden_states"][2].clone()  # layer N//2 where layer 2 was
    torch.save(rec, tmp_path / "record_wrong_fix.pt")
    cap = torch.load(tmp_path / "capture.pt", weights_only=True)
    cap["input_ids"][5] += 1
    torch.save(cap, tmp_path / "capture.pt")
    ckpt = torch.load(tmp_path / "data_0.ckpt", weights_only=True)
    ckpt["hidden_state"] = ckpt["hidden_state"].float()
    torch.save(ckpt, tmp_path / "data_0.ckpt")
    problems = "\n".join(compare_samples(tmp_path, SAMPLES))
    assert "record_wrong_fix.pt['hidden_states'][1]" in problems and "past the torch.bfloat16 tolerance" in problems
    assert "record_wrong_fix.pt vs capture.pt: verdict" in problems
    assert "capture.pt['input_ids']: integer values differ" in problems
    assert "data_0.ckpt: structure differs" in problems and "torch.float32" in problems


def test_samples_are_under_5_mb():
    """The tiny samples under 5 MB; the real pair's drafter and held-out sequences (``real/``) under 25 MB."""
    real = SAMPLES / "real"
    tiny = [p for p in SAMPLES.rglob("*") if p.is_file() and real not in p.parents]
    assert sum(p.stat().st_size for p in tiny) < 5 * 1024 * 1024
    assert sum(p.stat().st_size for p in real.rglob("*") if p.is_file()) < 25 * 1024 * 1024
