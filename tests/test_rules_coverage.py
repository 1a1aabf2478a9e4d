"""Every serving / target rule's release range is covered by rows read from a wheel (issue 41).

A row must name the releases at both ends of its range (an open range: the newest release the rules
know, ``engines.rules.NEWEST``) and a file; where the cited release's wheel is unpacked on this machine
(/work/wheels/src, see scripts/make_model_classes.py) the file must be there. The docs list every row,
and the per-release model-class table matches a fresh read of two releases' wheels.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from eagleforensics.engines.modelclasses import MODEL_CLASSES, RELEASES, class_row, eagle3_at
from eagleforensics.engines.releasetables import ReleaseRow, failure_sources, markdown, release_rows
from eagleforensics.engines.rules import NEWEST

ROOT = Path(__file__).resolve().parents[1]
WHEELS = Path("/work/wheels/src")
VERSION = re.compile(r"(?<![\w.#])(\d+\.\d+(?:\.\d+)*(?:\.post\d+)?)(?!\w)")
FILE = re.compile(r"[\w/]+\.py\b")


def cited(source: str) -> list[tuple[str, list[str], list[str]]]:
    """(engine, versions, files) per ``;``-separated clause of a citation; the engine carries over to later clauses."""
    out, engine = [], ""
    for clause in source.split(";"):
        m = re.search(r"\b(vllm|sglang)\b", clause)
        engine = m.group(1) if m else engine
        out.append((engine, VERSION.findall(clause), FILE.findall(clause)))
    return out


def test_a_row_without_its_releases_or_a_file_fails_the_check() -> None:
    """The check below must be able to fail: a row citing no file, or not its range's end, is caught."""
    assert problems(ReleaseRow("x", "vllm", "0.11.0", "0.12.0", "vllm 0.11.0 vllm/v1/spec_decode/eagle.py"))
    assert problems(ReleaseRow("x", "vllm", "0.11.0", "0.11.0", "vllm 0.11.0, read by hand"))
    assert problems(ReleaseRow("x", "vllm", "0.11.0", None, "vllm 0.11.0 vllm/v1/spec_decode/eagle.py"))
    assert not problems(ReleaseRow("x", "vllm", "0.11.0", None,
                                   f"vllm 0.11.0, {NEWEST['vllm']} vllm/v1/spec_decode/eagle.py"))


def problems(row: ReleaseRow) -> list[str]:
    clauses = cited(row.source)
    versions = {v for _, vs, _ in clauses for v in vs}
    files = [f for _, _, fs in clauses for f in fs]
    out = []
    if not files:
        out.append("cites no file")
    for end in (row.since, row.until or NEWEST[row.engine]):
        if end not in versions:
            out.append(f"does not cite release {end}")
    return out


@pytest.mark.parametrize("row", release_rows(), ids=lambda r: f"{r.rule}-{r.engine}-{r.since}")
def test_every_row_cites_its_range_and_a_file(row: ReleaseRow) -> None:
    assert problems(row) == [], (row.rule, row.engine, row.span(), row.source)


_FILES: dict[tuple[str, str], list[str]] = {}


def wheel_files(engine: str, version: str) -> list[str] | None:
    d = WHEELS / f"{engine}-{version}"
    if not (d / ".done").is_file():
        return None
    if (engine, version) not in _FILES:
        _FILES[engine, version] = [str(p.relative_to(d)) for p in d.rglob("*.py")]
    return _FILES[engine, version]


@pytest.mark.skipif(not WHEELS.is_dir(), reason="the released wheels are not unpacked on this machine")
def test_every_cited_file_is_in_the_cited_releases_wheel() -> None:
    sources = [r.source for r in release_rows()] + failure_sources()
    missing, checked = [], 0
    for source in sources:
        for engine, versions, files in cited(source):
            for v in versions:
                have = wheel_files(engine, v) if engine else None
                if have is None:
                    continue
                for f in files:
                    tail = "/".join(f.split("/")[-2:])
                    checked += 1
                    if not any(h == tail or h.endswith("/" + tail) for h in have):
                        missing.append(f"{engine} {v} {f}")
    assert checked > 40 and missing == [], missing


def test_the_docs_list_every_row() -> None:
    docs = (ROOT / "docs" / "serving-causes.md").read_text() + (ROOT / "docs" / "target-checks.md").read_text()
    table = markdown().splitlines()[2:]
    assert [line for line in table if line not in docs] == []


def test_model_class_rows_name_releases_read_and_a_file() -> None:
    for engine, table in MODEL_CLASSES.items():
        read = RELEASES[engine]
        for arch, runs in table.items():
            for first, last, file, cls, _eagle3, _roots in runs:
                assert first in read and last in read and file.endswith(".py") and cls, (engine, arch)


def test_a_release_not_read_is_said_not_answered() -> None:
    assert eagle3_at("vllm", "0.11.0", "Qwen3NextForCausalLM")[0] == "no"
    assert eagle3_at("vllm", "0.25.0", "Qwen3NextForCausalLM")[0] == "yes"
    status, text = eagle3_at("vllm", "0.20.0", "Qwen3NextForCausalLM")
    assert status == "unread" and "not read for this release" in text
    with pytest.raises(KeyError):
        class_row("vllm", "0.20.0", "LlamaForCausalLM")


def _script():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("make_model_classes", ROOT / "scripts" / "make_model_classes.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("engine, version", [("vllm", "0.11.0"), ("sglang", "0.5.8")])
def test_the_committed_model_classes_match_a_fresh_read_of_the_wheel(engine: str, version: str) -> None:
    d = WHEELS / f"{engine}-{version}"
    if not (d / ".done").is_file():
        pytest.skip(f"{engine} {version} is not unpacked on this machine")
    mod = _script()
    fresh = mod.read_vllm(d) if engine == "vllm" else mod.read_sglang(d)
    committed = {arch: class_row(engine, version, arch) for arch in fresh}
    diff = [arch for arch, (f, cls, yes, roots) in fresh.items()
            if committed[arch] is None or (committed[arch].file, committed[arch].cls, committed[arch].eagle3,
                                           committed[arch].roots) != (f, cls, yes, tuple(roots))]
    assert diff == [] and len(fresh) > 100
