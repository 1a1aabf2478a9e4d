"""The vocab-map check says what the user's engine release does with d2t, from rows read at each release.

Before, every d2t finding cited SGLang 0.5.23 and vLLM 0.33.0 whatever release the user named. Now
``engines.embedrules.D2T_RULES`` holds one row per engine, read at every release it spans; the check names the user's
release (the newest read, said to be assumed, when only the engine is known), says a release past the rows is not
read, and says a release inside a row but not itself read sits between releases read that agree. The rows are
checked against the unpacked wheels where this machine has them (skipped on CI).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.checks.registry import get_check
from eagleforensics.doctor import diagnose
from eagleforensics.engines.releasetables import release_rows
from eagleforensics.engines.embedrules import D2T_RULES, d2t_reading
from eagleforensics.testing.defects import DEFECTS, plant

WHEELS = Path(os.environ.get("EAGLEFORENSICS_WHEELS", "/work/wheels/src"))
ROW = {r.engine: r for r in D2T_RULES}


@pytest.fixture(scope="module")
def no_d2t(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """The sample drafter (trained on a real tiny Llama's states) with its d2t dropped and kept in a side file."""
    return plant(next(d for d in DEFECTS if d.name == "d2t-missing"), tmp_path_factory.mktemp("no-d2t"))


def _finding(case, **inputs):  # noqa: ANN001, ANN003, ANN202
    report = diagnose(DoctorInputs(drafter=str(case.drafter), target=str(case.target), **inputs),
                      checks=[get_check("vocab-map")], pipelines=())
    found = [r.finding for r in report.flagged]
    assert [f.code for f in found] == ["d2t-missing"], report.to_text()
    row = next(o for o in report.outcomes if o.name == "vocab-map")
    return found[0], row.data


@pytest.mark.parametrize("engine, version, says, cites", [
    ("sglang", "0.5.8", "SGLang 0.5.8 then takes draft id i as target id i", "sglang"),
    ("vllm", "0.11.0", "vLLM 0.11.0 then takes draft id i as target id i", "vllm"),
    ("vllm", None, "vLLM 0.34.0 (the newest release read, assumed: pass --engine-version or --log) then takes", "vllm"),
    ("sglang", "0.5.2", "SGLang 0.5.2 (not read; the releases read on both sides of it, 0.4.10 - 0.5.23, agree)",
     "sglang"),
])
def test_the_finding_names_the_users_release_and_cites_its_row(no_d2t, engine: str, version: str | None,  # noqa: ANN001
                                                               says: str, cites: str) -> None:
    f, data = _finding(no_d2t, engine=engine, engine_version=version)
    assert says in f.message and f.severity == "error", f.message
    assert ROW[cites].source in f.source and ROW[{"sglang": "vllm", "vllm": "sglang"}[cites]].source not in f.source
    assert data["engine_rows"] == [f"{cites} {ROW[cites].span()}"]
    assert data["release_assumed"] == (None if version else "0.34.0") and data["release_not_read"] is None


@pytest.mark.parametrize("engine, version, unread, read", [
    ("vllm", "0.35.0", "vLLM 0.35.0", "vLLM (0.9.2 - 0.34.0 read) then takes"),
    ("sglang", "0.6.1", "SGLang 0.6.1", "SGLang (0.4.10 - 0.5.23 read) then takes"),
    ("vllm", "0.8.5", "vLLM 0.8.5", "vLLM (0.9.2 - 0.34.0 read) then takes"),
    ("trtllm", None, "TensorRT-LLM", "SGLang (0.4.10 - 0.5.23 read) and vLLM (0.9.2 - 0.34.0 read) then take"),
])
def test_a_release_not_read_is_said_not_answered_with_another_releases_row(no_d2t, engine: str,  # noqa: ANN001
                                                                          version: str | None, unread: str,
                                                                          read: str) -> None:
    f, data = _finding(no_d2t, engine=engine, engine_version=version)
    assert f"{unread} is not read for this release; at the releases read, {read} draft id i" in f.message, f.message
    assert data["release_not_read"] == unread and data["release_assumed"] is None
    assert len(data["engine_rules"]) == len(data["engine_rows"]) == (2 if engine == "trtllm" else 1)


def test_with_no_engine_both_rows_answer_and_the_side_file_is_said_unread(no_d2t) -> None:  # noqa: ANN001
    f, data = _finding(no_d2t)
    assert "stores no d2t: SGLang (0.4.10 - 0.5.23 read) and vLLM (0.9.2 - 0.34.0 read) then take" in f.message
    assert "d2t.pt beside the weights is never read" in f.message, f.message
    assert all(r.source in f.source for r in D2T_RULES) and "vllm-project/vllm#18909" in f.source
    assert data["engine_rows"] == ["sglang 0.4.10 - 0.5.23", "vllm 0.9.2 - 0.34.0"]


def test_the_rows_are_in_the_release_tables_the_coverage_test_checks() -> None:
    rows = [r for r in release_rows() if r.rule == "vocab-map (d2t)"]
    assert [(r.engine, r.since, r.until) for r in rows] == [(r.engine, r.since, r.until) for r in D2T_RULES]
    for r in D2T_RULES:  # every release the row says it read is cited, and nothing else
        cited = set(re.findall(r"(?<![\w.#])(\d+\.\d+\.\d+(?:\.\d+)?)(?!\w)", r.source))
        assert cited == set(r.read), (r.engine, cited ^ set(r.read))


def test_a_reading_between_rows_is_not_called_read() -> None:
    assert d2t_reading("sglang", "0.5.23").between is False
    assert d2t_reading("sglang", "0.5.8.0").between is False  # one release, two spellings
    assert d2t_reading("sglang", "0.5.13").between is True
    assert d2t_reading(None, None).rows == D2T_RULES


# what each row says, as it reads in the wheel's llama_eagle3.py (the file every row cites)
WHEEL_FACTS = {
    "sglang": ("sglang/srt/models/llama_eagle3.py",
               (r"hot_token_id = loaded_weight \+ torch\.arange\(", r'if "t2d" in name:\s*\n\s*continue')),
    "vllm": ("vllm/model_executor/models/llama_eagle3.py",
             (r"torch\.zeros\(self\.config\.draft_vocab_size, dtype=torch\.long\)",
              r"targets = base \+ self\.draft_id_to_target_id", r'if "t2d" in name:\s*\n\s*continue')),
}


@pytest.mark.parametrize("engine, version", [(r.engine, v) for r in D2T_RULES for v in r.read])
def test_every_release_a_row_read_holds_what_the_row_says(engine: str, version: str) -> None:
    d = WHEELS / f"{engine}-{version}"
    if not (d / ".done").is_file():
        pytest.skip(f"{engine} {version} is not unpacked on this machine")
    path, facts = WHEEL_FACTS[engine]
    text = (d / path).read_text()
    assert [f for f in facts if not re.search(f, text)] == [], (engine, version)
    if engine == "sglang":  # an EAGLE-3 drafter ignores --speculative-token-map in every EAGLE worker that reads it
        workers = [p for p in (d / "sglang/srt/speculative").glob("*eagle_worker*.py") if "speculative_token_map" in
                   p.read_text()]
        assert workers and all("EAGLE3 models already have this" in p.read_text() for p in workers), version


def test_an_engine_read_from_the_log_says_how_its_release_was_taken(no_d2t, tmp_path: Path) -> None:  # noqa: ANN001
    """No --engine: the engine comes from the log's arguments line. SGLang's line names no release, so the newest
    read is assumed and the message asks for --engine-version (not --log, which was given); a vLLM log that prints
    its version is answered at that version, said to come from the log."""
    log = Path(__file__).resolve().parents[1] / "data_samples" / "incident" / "broken.log"
    f, data = _finding(no_d2t, log=str(log))
    assert ("stores no d2t: SGLang 0.5.23 (the newest release read, assumed: the log does not say which: pass "
            "--engine-version) then takes draft id i") in f.message, f.message
    assert data["engine_rows"] == [f"sglang {ROW['sglang'].span()}"] and data["release_assumed"] == "0.5.23"
    vllm_log = tmp_path / "vllm.log"
    vllm_log.write_text("INFO 11-30 10:00:00 [__init__.py:1] vLLM API server version 0.11.0\n"
                        "INFO 11-30 10:00:01 [utils.py:1] non-default args: {'model': 'meta-llama/Llama-3.1-8B', "
                        "'speculative_config': {'method': 'eagle3', 'model': 'x', 'num_speculative_tokens': 3}}\n")
    f, data = _finding(no_d2t, log=str(vllm_log))
    assert "stores no d2t: vLLM 0.11.0 (version from the log) then takes draft id i" in f.message, f.message


def test_the_consequence_of_a_missing_d2t_is_not_answered_for_a_release_not_read() -> None:
    """The rows end at the last release read: a later one gets no row's answer (the rows were open-ended before)."""
    from eagleforensics.engines.embedrules import d2t_missing_consequence, d2t_rule

    assert d2t_rule("vllm", "0.35.0") is None and d2t_rule("sglang", "0.4.9") is None
    assert d2t_missing_consequence("vllm", "0.35.0", 256, 512) == \
        "not established for vLLM 0.35.0: not read for this release"
    assert "maps draft id i to target id i" in d2t_missing_consequence("vllm", "0.34.0", 256, 512)
