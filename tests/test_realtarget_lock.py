"""The real target's cache is built once when several processes ask at the same time (the suite's workers)."""
from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from eagleforensics.testing import realtarget


def _fake_build(gguf: Path, out: Path) -> None:
    """Stands in for the 1-2 minute dequantization: marks the build and writes the two files target_dir checks."""
    with open(out.parent / "builds.log", "a") as log:
        log.write(f"{out.name}\n")
    time.sleep(0.5)  # long enough that the other processes ask while this one builds
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"")


def _ask(root: str) -> str:
    realtarget._build = _fake_build  # in this child only
    return str(realtarget.target_dir(Path(root)))


def test_processes_asking_at_once_build_the_target_once(tmp_path: Path) -> None:
    try:
        realtarget.gguf_path()
    except realtarget.TargetUnavailable as exc:
        pytest.skip(str(exc))
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        got = pool.map_async(_ask, [str(tmp_path)] * 3).get(timeout=120)
    assert len(set(got)) == 1 and (Path(got[0]) / "config.json").is_file()
    builds = (tmp_path / "real-target" / "builds.log").read_text().splitlines()
    assert len(builds) == 1, builds  # without the lock each process built its own copy
    assert not [p for p in (tmp_path / "real-target").iterdir() if p.name.startswith(".build-")]
