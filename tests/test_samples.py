"""data_samples/ is what scripts/make_samples.py writes, byte for byte, and stays small."""
from __future__ import annotations

import hashlib
import subprocess
import sys

from .realdata import ROOT, SAMPLES


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_samples_regenerate_byte_for_byte(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_samples.py"), str(tmp_path)], check=True)
    shipped = sorted(p.name for p in SAMPLES.iterdir() if p.is_file() and p.name != "README.md")
    assert sorted(p.name for p in tmp_path.iterdir()) == shipped
    for name in shipped:
        assert _digest(tmp_path / name) == _digest(SAMPLES / name), name


def test_samples_are_under_5_mb():
    assert sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file()) < 5 * 1024 * 1024
