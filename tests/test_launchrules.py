"""Launch rules: the sourced per-release facts doctor checks a server's arguments line against."""
from __future__ import annotations

import re

import pytest

from eagleforensics.engines import launchrules as lr
from eagleforensics.errors import ForensicsError


def test_every_row_cites_a_release_and_a_file():
    for row in lr.describe_launch_rules():
        assert re.search(r"\d+\.\d+\.\d+", row["source"]), row
        assert ".py" in row["source"] or "arg_groups" in row["source"], row


@pytest.mark.parametrize("table, key", [
    (lr.ALGORITHM_RULES, lambda r: (r.engine,)),
    (lr.LAUNCH_FACTS, lambda r: (r.engine, r.topic, r.families)),
    (lr.PP_SPLITS, lambda r: (r.engine,)),
    (lr.STATS_INTERVALS, lambda r: (r.engine,)),
])
def test_rows_of_one_kind_do_not_overlap(table, key):
    """Within one engine/topic/family the ranges are ordered and disjoint: a version picks one row."""
    groups: dict = {}
    for row in table:
        groups.setdefault(key(row), []).append(row)
    for rows in groups.values():
        rows.sort(key=lambda r: lr.parse_version(r.since))
        for a, b in zip(rows, rows[1:]):
            assert a.until is not None and lr.parse_version(a.until) < lr.parse_version(b.since), (a, b)


def test_the_supported_range_starts_are_covered():
    assert lr.algorithm_rule("sglang", "0.4.0") is not None and lr.algorithm_rule("vllm", "0.10.0") is not None
    assert lr.launch_fact("pp-aux", "sglang", "0.4.0") is not None
    assert lr.launch_fact("pp-aux", "vllm", "0.10.0", "llama") is not None


@pytest.mark.parametrize("engine, version, name", [
    ("sglang", "0.4.0", None), ("sglang", "0.4.3", None), ("sglang", "0.4.6", "EAGLE3"), ("sglang", "0.5.23", "EAGLE3"),
    ("sglang", None, "EAGLE3"), ("vllm", "0.10.0", "eagle3"), ("vllm", "0.33.0", "eagle3"),
])
def test_eagle3_needs_eagle3(engine, version, name):
    assert lr.eagle3_algorithm(engine, version) == name


def test_eagle_for_eagle3_and_omitted_method():
    assert lr.launch_fact("eagle-for-eagle3", "sglang", "0.5.5").outcome == "no-aux"
    assert "fc is skipped" in lr.launch_fact("eagle-for-eagle3", "sglang", "0.5.5").detail
    assert lr.launch_fact("eagle-for-eagle3", "vllm", "0.20.0").outcome == "no-aux"
    assert lr.launch_fact("method-omitted", "vllm", "0.10.1.1").outcome == "eagle"  # the 'eagle3-' trap
    assert lr.launch_fact("method-omitted", "vllm", "0.10.2").outcome == "eagle3"
    assert lr.launch_fact("method-omitted", "sglang", "0.5.5") is None  # SGLang has no auto-detection


def test_draft_path_missing():
    assert lr.launch_fact("draft-path-missing", "sglang", "0.4.6").outcome == "error"
    assert lr.launch_fact("draft-path-missing", "sglang", "0.4.7").outcome == "target-as-draft"
    assert lr.launch_fact("draft-path-missing", "vllm", "0.33.0").outcome == "error"


@pytest.mark.parametrize("engine, version, model_type, verdict, word", [
    ("sglang", "0.4.6", None, None, "unsupported"),
    ("sglang", "0.5.5", None, None, "rejected"),
    ("sglang", "0.5.23", "qwen3", None, "rejected"),
    ("vllm", "0.10.0", "llama", False, "drops"),
    ("vllm", "0.17.1", "llama", False, "drops"),
    ("vllm", "0.29.0", "qwen3", False, "drops"),
    ("vllm", "0.30.0", "llama", True, "survives"),
    ("vllm", None, "llama", True, "survives"),
    ("vllm", "0.33.0", "deepseek_v3", False, "drops"),
    ("vllm", "0.14.0", "deepseek_v3", None, "unsupported"),
    ("vllm", "0.33.0", "gpt_oss", None, "no pipeline-parallel rule"),
])
def test_aux_survives_pp(engine, version, model_type, verdict, word):
    got, source = lr.aux_survives_pp(engine, version, model_type)
    assert got is verdict and source.startswith(word)


@pytest.mark.parametrize("engine, version, n, pp, sizes", [
    ("vllm", "0.33.0", 32, 3, [11, 11, 10]),   # remainder to stages -2, -3 (get_pp_indices)
    ("vllm", "0.10.0", 32, 5, [6, 6, 7, 7, 6]),  # 2 extra: stages -2 and -3
    ("vllm", "0.20.0", 30, 4, [7, 8, 8, 7]),
    ("vllm", "0.20.0", 32, 2, [16, 16]),
    ("sglang", "0.5.5", 32, 3, [10, 10, 12]),  # last stage takes the rest
    ("sglang", "0.5.6", 32, 3, [10, 11, 11]),  # the last N % pp stages get one more
    ("sglang", "0.5.23", 61, 4, [15, 15, 15, 16]),
])
def test_pp_split(engine, version, n, pp, sizes):
    stages = lr.pp_stage_of_layers(engine, version, n, pp)
    assert [len(r) for r in stages] == sizes
    assert stages[0].start == 0 and stages[-1].stop == n
    assert all(a.stop == b.start for a, b in zip(stages, stages[1:]))


def test_pp_split_is_a_partition_for_every_shape():
    for engine, version in (("vllm", "0.33.0"), ("sglang", "0.5.0"), ("sglang", "0.5.23")):
        for n in range(1, 40):
            for pp in range(1, 9):
                stages = lr.pp_stage_of_layers(engine, version, n, pp)
                assert sum(len(r) for r in stages) == n and len(stages) == pp
                assert [i for r in stages for i in r] == list(range(n))


def test_pp_partition_override_and_bad_input():
    assert [len(r) for r in lr.pp_stage_of_layers("vllm", None, 10, 2, partition=[3, 7])] == [3, 7]
    with pytest.raises(ForensicsError, match="VLLM_PP_LAYER_PARTITION"):
        lr.pp_stage_of_layers("vllm", None, 10, 2, partition=[3, 6])
    with pytest.raises(ForensicsError, match="positive"):
        lr.pp_stage_of_layers("sglang", None, 0, 2)
    with pytest.raises(ForensicsError, match="unknown engine"):
        lr.pp_stage_of_layers("trtllm", None, 10, 2)


def test_stage_of_position_follows_the_capture_point():
    # vLLM 0.33.0 (after-layer): p is taken after layer p-1; stages [0, 16) and [16, 32)
    assert [lr.pp_stage_of_position("vllm", "0.33.0", 32, 2, p) for p in (0, 2, 16, 17, 32)] == [0, 0, 0, 1, 1]
    # vLLM 0.17.1 (before-layer): p is taken before layer p, and p = N never
    assert [lr.pp_stage_of_position("vllm", "0.17.1", 32, 2, p) for p in (0, 2, 16, 17, 32)] == [0, 0, 1, 1, None]
    assert lr.pp_stage_of_position("vllm", "0.33.0", 32, 2, 33) is None


def test_decode_log_interval_and_stats_interval():
    assert lr.decode_log_interval("sglang", "0.4.0") == 40 and lr.decode_log_interval("sglang") == 40
    assert lr.decode_log_interval("vllm", "0.33.0") is None
    assert lr.stats_interval("vllm", "0.10.0").setting == "fixed"
    assert lr.stats_interval("vllm", "0.11.0").setting == "VLLM_LOG_STATS_INTERVAL"
