"""Tests for eagleforensics.engines.rules: one test per table row (naming its source), versions,
the generic appliers and round trips. Expected values are worked out by hand from
docs/conventions.md and the wheels the row cites, never computed from the table."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagleforensics.engines import rules
from eagleforensics.engines.rules import (
    CAPTURE_RULES, KEY_RULES, NESTED_KEY, NESTED_LAYER_IDS_KEY, RUNNER_RULES, TOP_KEY, YAML_KEY,
    Rule, answers_by_version, concat_order, default_ids, describe_rules, ids_for_positions,
    parse_version, positions_for_ids, resolve, served_positions, trainer_final_expectation,
)
from eagleforensics.errors import ForensicsError
from eagleforensics.positions import Position, default_aux_positions

N = 12
R, X, U = "raises", "-", "unsupported"  # an id that raises, captures nothing, family unsupported
# probes: [2,6,9], [1,5,8] (first id 1), then single ids -1, 0, N-1, N
PROBES = ([2, 6, 9], [1, 5, 8], [-1], [0], [N - 1], [N])
_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen2_moe": "qwen2_moe", "qwen3_moe": "qwen3_moe",
         "deepseek": "deepseek_v3", "gpt_oss": "gpt_oss"}


def _res(rule: Rule, ids: list[int]) -> list:
    """Per id: p, 'p12n' for post-norm, or R / X / U."""
    out = []
    for o in positions_for_ids(rule, ids, N):
        if o.position is not None:
            out.append(f"p{o.position.p}n" if o.position.normed else o.position.p)
        else:
            out.append({"raises": R, "unsupported": U}.get(o.effect, X))
    return out


def _flat(rule: Rule) -> list:
    return [_res(rule, p) for p in PROBES]


S1 = [[3, 7, 10], [2, 6, 9]]  # id k -> p k+1
V0 = [[2, 6, 9], [1, 5, 8]]   # id k -> p k
UNSUP = [[U] * 3, [U] * 3, [U], [U], [U], [U]]

# Hand-worked answers per capture row (label -> probes), from docs/conventions.md and the cited files.
CAPTURE_EXPECT = {
    "sglang llama 0.4.10 - 0.5.21": S1 + [[R], [1], [X], [X]],
    "sglang llama >= 0.5.22": S1 + [[0], [1], [X], [X]],
    "sglang qwen3 >= 0.4.10": S1 + [[0], [1], [X], [X]],
    "sglang qwen2 0.4.10 - 0.5.1.post3": UNSUP,
    "sglang qwen2 >= 0.5.2": S1 + [[0], [1], [X], [X]],
    "sglang qwen2_moe 0.4.10 - 0.5.1.post3": UNSUP,
    "sglang qwen2_moe 0.5.2 - 0.5.4.post1": S1 + [[0], [1], [X], [X]],
    "sglang qwen3_moe 0.4.10 - 0.5.4.post1": S1 + [[0], [1], [X], [X]],
    "sglang qwen2_moe/qwen3_moe >= 0.5.4.post2": S1 + [[0], [1], [R], [R]],
    "sglang deepseek 0.4.10 - 0.5.4.post1": UNSUP,
    "sglang deepseek 0.5.4.post2 - 0.5.12.post1": S1 + [[R], [1], [X], [X]],
    "sglang deepseek 0.5.13": [[2, 6, 9], [2, 6, 9], [X], [R], [11], [X]],
    "sglang deepseek 0.5.14 - 0.5.17": [[2, 6, 9], [2, 6, 9], [X], [0], [11], [X]],
    "sglang deepseek >= 0.5.18": [[2, 6, 9], [2, 6, 9], [X], [0], [11], [X]],
    "sglang gpt_oss 0.5.3 - 0.5.16": S1 + [[R], [1], [X], [X]],
    "sglang gpt_oss >= 0.5.17": S1 + [[0], [1], [12], [12]],
    "vllm llama/qwen2/qwen3/qwen2_moe/qwen3_moe 0.10.1.1 - 0.17.1": V0 + [[X], [R], [11], [X]],
    "vllm llama/qwen2/qwen3/qwen2_moe/qwen3_moe >= 0.18.0": V0 + [[X], [0], [11], [12]],
    "vllm gpt_oss 0.10.1.1 - 0.10.2": UNSUP,
    "vllm gpt_oss 0.11.0 - 0.17.1": V0 + [[X], [0], [11], [X]],
    "vllm gpt_oss >= 0.18.0": V0 + [[X], [0], [11], [12]],
    "vllm deepseek 0.10.1.1 - 0.17.1": UNSUP,
    "vllm deepseek 0.18.0 - 0.25.1": V0 + [[X], [R], [11], [X]],
    "vllm deepseek >= 0.26.0": V0 + [[X], [R], [11], [12]],
    "trtllm llama/qwen2/qwen3/qwen2_moe/qwen3_moe/deepseek/gpt_oss one-model >= main":
        S1 + [["p12n"], [1], [12], [X]],
    "trtllm llama/qwen2/qwen3/qwen2_moe/qwen3_moe/deepseek/gpt_oss two-model >= main":
        S1 + [["p12n"], [1], [12], [X]],
}
# what [-1, 2, 9] comes out as (concatenation order) on the two TRT-LLM modes
TRT_ORDER = {"one-model": ["p12 post-norm", "p3", "p10"], "two-model": ["p3", "p10", "p12 post-norm"]}


def _cites(source: str) -> bool:
    """A source names a version (or main / docs/conventions.md) and a file."""
    return bool(re.search(r"(\d+\.\d+\.\d+|main|conventions\.md)", source)) and (
        ".py" in source or "docs/conventions.md" in source)


def _rule_for_capture(row) -> Rule:
    mode = row.mode
    fam = row.families[0]
    return resolve(row.engine, _TYPE[fam], None if row.engine == "trtllm" else row.since, mode=mode)


@pytest.mark.parametrize("row", CAPTURE_RULES, ids=lambda r: f"{r.label} [{r.source[:60]}]")
def test_capture_row(row):
    """One test per capture row: the row resolves at its first version and gives the hand answers."""
    assert _cites(row.source), row.source
    for fam in row.families:
        rule = resolve(row.engine, _TYPE[fam], None if row.engine == "trtllm" else row.since,
                       mode=row.mode)
        assert rule.capture is row, (fam, rule.capture.label, row.source)
        if row.until is not None and row.engine != "trtllm":
            assert resolve(row.engine, _TYPE[fam], row.until, mode=row.mode).capture is row
    assert _flat(_rule_for_capture(row)) == CAPTURE_EXPECT[row.label], row.source
    if row.engine == "trtllm":
        got = [q.label for q in served_positions(_rule_for_capture(row), [-1, 2, 9], N)]
        assert got == TRT_ORDER[row.mode], row.source


def test_every_capture_row_has_a_hand_answer():
    """The expectations above cover every row and nothing else (a new row needs its own)."""
    assert {r.label for r in CAPTURE_RULES} == set(CAPTURE_EXPECT)


# Key rows: (version to resolve at, runner) -> what each draft gives: key read, capture off.
# Drafts: top [1,2,3] + nested [4,5,6] (both); nested only; eagle_config.layer_ids only;
# nested []; nested + use_aux_hidden_state false.
KEY_EXPECT = {
    "sglang keys 0.4.10 - 0.5.12": (NESTED_KEY, NESTED_KEY, None, "fails", False),
    "sglang keys >= 0.5.12.post1": (NESTED_KEY, NESTED_KEY, None, "fails", True),
    "vllm v1 runner keys 0.10.1.1 - 0.11.0": (None, None, None, "absent", False),
    "vllm v1 runner keys 0.11.1 - 0.17.0": (TOP_KEY, None, None, "absent", False),
    "vllm v1 runner keys 0.17.1 - 0.21.0": (TOP_KEY, None, None, "absent", True),
    "vllm v1 runner keys 0.22.0 - 0.33.0": (TOP_KEY, NESTED_KEY, None, "absent", True),  # no V1 runner from 0.34.0
    "vllm v2 runner keys 0.17.1 - 0.27.1": (TOP_KEY, None, None, "absent", False),
    "vllm v2 runner keys 0.28.0 - 0.32.0": (TOP_KEY, None, NESTED_LAYER_IDS_KEY, "absent", False),
    "vllm v2 runner keys >= 0.33.0": (TOP_KEY, None, NESTED_LAYER_IDS_KEY, "absent", True),
    "trtllm keys >= main": (None, None, None, "absent", False),
}


def _first_read(keys: tuple[str, ...], present: set[str]) -> str | None:
    return next((k for k in keys if k in present), None)


@pytest.mark.parametrize("row", KEY_RULES, ids=lambda r: f"{r.label} [{r.source[:60]}]")
def test_key_row(row):
    """One test per key row: which key wins for each draft kind, empty list, use_aux flag."""
    assert _cites(row.source), row.source
    rule = resolve(row.engine, "llama", None if row.engine == "trtllm" else row.since, row.runner)
    assert rule.keys is row, row.source
    both, nested, layer_ids, empty, off = KEY_EXPECT[row.label]
    assert _first_read(row.keys, {TOP_KEY, NESTED_KEY}) == both, row.source
    assert _first_read(row.keys, {NESTED_KEY}) == nested, row.source
    assert _first_read(row.keys, {NESTED_LAYER_IDS_KEY}) == layer_ids, row.source
    assert row.empty_list == empty and row.use_aux_off is off, row.source
    if row.engine == "trtllm":
        assert row.keys == (YAML_KEY,)


def test_every_key_row_has_a_hand_answer():
    assert {r.label for r in KEY_RULES} == set(KEY_EXPECT)


# Runner rows: which runner a plain `vllm serve` picks for these model types (hand from config/vllm.py)
_RUN_TYPES = ("llama", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3", "kimi_k2", "gpt_oss")
RUNNER_EXPECT = {
    "vllm default runner 0.10.1.1 - 0.21.0": ("v1", "v1", "v1", "v1", "v1", "v1", "v1"),
    "vllm default runner 0.22.0 - 0.23.0": ("v1", "v2", "v1", "v1", "v1", "v1", "v1"),
    "vllm default runner 0.24.0 - 0.25.1": ("v2", "v2", "v1", "v2", "v1", "v1", "v1"),
    "vllm default runner 0.26.0 - 0.28.0": ("v2", "v2", "v1", "v2", "v1", "v1", "v1"),
    "vllm default runner 0.29.0 - 0.33.0": ("v2", "v2", "v2", "v2", "v2", "v2", "v2"),
    "vllm default runner >= 0.34.0": ("v2", "v2", "v2", "v2", "v2", "v2", "v2"),  # V1 removed
}


@pytest.mark.parametrize("row", RUNNER_RULES, ids=lambda r: f"{r.label} [{r.source[:60]}]")
def test_runner_row(row):
    """One test per runner row: the default vLLM model runner per architecture."""
    assert _cites(row.source), row.source
    got = tuple(resolve("vllm", mt, row.since).runner for mt in _RUN_TYPES)
    assert got == RUNNER_EXPECT[row.label], row.source
    if row.until is not None:
        assert tuple(resolve("vllm", mt, row.until).runner for mt in _RUN_TYPES) == got


def test_every_runner_row_has_a_hand_answer():
    assert {r.label for r in RUNNER_RULES} == set(RUNNER_EXPECT)


def test_describe_rules_lists_every_row_with_its_source():
    rows = describe_rules()
    assert len(rows) == len(CAPTURE_RULES) + len(KEY_RULES) + len(RUNNER_RULES)
    assert all(r["source"] and r["label"] for r in rows)
    assert {r["table"] for r in rows} == {"capture", "keys", "runner"}


# --- versions --------------------------------------------------------------------------------------

def test_parse_version_orders_post_releases():
    """packaging order: 0.5.4.post1 < 0.5.4.post2 < 0.5.5 and 0.5.12.post1 < 0.5.13."""
    assert parse_version("0.5.4.post1") < parse_version("0.5.4.post2") < parse_version("0.5.5")
    assert parse_version("0.5.12.post1") < parse_version("0.5.13")
    assert parse_version("v0.33.0") == parse_version("0.33")
    with pytest.raises(ForensicsError, match="X.Y.Z"):
        parse_version("latest")


def test_parse_version_is_parsed_once_and_refused_every_time():
    """One align resolves every engine at every known version (~800 parses): each text is parsed once.
    A refusal is not cached away: it is raised again, naming what the user wrote."""
    assert parse_version("0.5.12.post1") is parse_version(" v0.5.12.post1")
    assert parse_version(0.5) == parse_version("0.5")  # not text: read as its str(), as before
    for _ in range(2):
        with pytest.raises(ForensicsError, match="'vlatest'"):
            parse_version("vlatest")


@pytest.mark.parametrize("version,label", [
    ("0.5.4.post1", "sglang deepseek 0.4.10 - 0.5.4.post1"),
    ("0.5.4.post2", "sglang deepseek 0.5.4.post2 - 0.5.12.post1"),
    ("0.5.12.post1", "sglang deepseek 0.5.4.post2 - 0.5.12.post1"),
    ("0.5.13", "sglang deepseek 0.5.13"),
    ("0.5.13.post1", "sglang deepseek 0.5.13"),
    ("0.5.14", "sglang deepseek 0.5.14 - 0.5.17"),
])
def test_post_release_boundaries(version, label):
    """DeepSeek/Kimi boundaries fall on post releases: compared properly, not by prefix."""
    assert resolve("sglang", "kimi_k2", version).capture.label == label


def test_no_version_means_newest_and_says_so():
    rule = resolve("sglang", "llama")
    assert rule.version == "0.5.23" and not rule.version_given
    assert any("newest release" in n for n in rule.notes)
    assert resolve("vllm", "llama").version == "0.34.0"


def test_versions_outside_the_table_are_flagged():
    assert any("newer" in n for n in resolve("vllm", "llama", "0.40.0").notes)
    assert any("older" in n for n in resolve("sglang", "gpt_oss", "0.4.10").notes)


def test_kimi_answers_by_version():
    """Kimi-K2 N=61 [2,30,58]: none before 0.5.4.post2, p 3,31,59 to 0.5.12.post1, p 2,30,58 from 0.5.13."""
    got = answers_by_version("sglang", "kimi_k2",
                             lambda r: tuple(q.p for q in served_positions(r, [2, 30, 58], 61)))
    assert got == [("0.4.10 - 0.5.4.post1", ()), ("0.5.4.post2 - 0.5.12.post1", (3, 31, 59)),
                   (">= 0.5.13", (2, 30, 58))]


def test_minus_one_per_engine_family_version():
    """[-1, 2, 30], N=61: what -1 reaches differs by engine, family and version (docs/conventions.md)."""
    def first(engine, mt, version=None, mode=None):
        return positions_for_ids(resolve(engine, mt, version, mode=mode), [-1, 2, 30], 61)[0]

    assert first("sglang", "llama", "0.5.21").effect == "raises"
    assert first("sglang", "llama", "0.5.22").position == Position(0)
    assert first("sglang", "qwen3", "0.4.10").position == Position(0)
    assert first("sglang", "kimi_k2", "0.5.12.post1").effect == "raises"
    assert first("sglang", "kimi_k2", "0.5.14").effect == "nothing"  # taken verbatim: index -1
    assert first("sglang", "gpt_oss", "0.5.16").effect == "raises"
    assert first("sglang", "gpt_oss", "0.5.17").position == Position(0)
    assert first("vllm", "llama").effect == "nothing"
    assert first("trtllm", "llama").position == Position(61, normed=True)
    assert [q.label for q in served_positions(resolve("trtllm", "kimi_k2"), [-1, 2, 30], 61)] == [
        "p61 post-norm", "p3", "p31"]


def test_qwen_versions_split_by_family():
    """Dense Qwen2 and Qwen2-MoE are hooked from 0.5.2, Qwen3-MoE from 0.4.10 (issue 20; the wheels'
    qwen2.py / qwen2_moe.py / qwen3_moe.py, cited in the rows)."""
    def served(mt, version):
        rule = resolve("sglang", mt, version)
        return [o.position.p if o.position else o.effect for o in positions_for_ids(rule, [2, 6, 9], N)]

    for mt in ("qwen2", "qwen2_moe"):
        assert served(mt, "0.5.1.post3") == ["unsupported"] * 3
        assert served(mt, "0.5.2") == [3, 7, 10]
    assert served("qwen3_moe", "0.4.10") == [3, 7, 10]
    assert served("qwen3_moe", "0.5.1.post3") == [3, 7, 10]
    got = answers_by_version("sglang", "qwen2_moe", lambda r: tuple(q.p for q in served_positions(r, [2, 6, 9], N)))
    assert got[0] == ("0.4.10 - 0.5.1.post3", ()) and got[-1][0] == ">= 0.5.2" and got[-1][1] == (3, 7, 10)


def test_qwen_moe_negative_ids_count_from_the_end_from_0_5_4_post2():
    """0.5.4.post2 marks self.layers[id + 1]: id -2 is layer N-1 (p N-1); id -N-1 is layer 0 (p0);
    below that IndexError; before, the model loop never meets a negative index (nothing)."""
    def out(mt, version, ids):
        return positions_for_ids(resolve("sglang", mt, version), ids, N)

    for mt in ("qwen2_moe", "qwen3_moe"):
        new = out(mt, "0.5.4.post2", [-2, -4, -N - 1, -N - 2])
        assert [o.position for o in new[:3]] == [Position(N - 1), Position(N - 3), Position(0)]
        assert "counted from the end" in new[0].note and new[3].effect == "raises"
        dup = out(mt, "0.5.23", [-2, N - 2])  # both mark layer N-1
        assert dup[0].position == Position(N - 1) and dup[1].effect == "duplicate"
        assert [o.effect for o in out(mt, "0.5.4.post1", [-2, -4])] == ["nothing", "nothing"]
    assert out("llama", "0.5.23", [-2])[0].effect == "nothing"  # the dense loop: nothing
    assert out("qwen2", "0.5.23", [-2])[0].effect == "nothing"


def test_resolve_rejects_unknowns_with_allowed_values():
    with pytest.raises(ForensicsError, match="vllm, sglang, trtllm"):
        resolve("tgi")
    with pytest.raises(ForensicsError, match="deepseek_v3"):
        resolve("sglang", "falcon")
    with pytest.raises(ForensicsError, match="vLLM only"):
        resolve("sglang", "llama", runner="v2")
    with pytest.raises(ForensicsError, match="0.17.1"):
        resolve("vllm", "llama", "0.11.2", "v2")


def test_kimi_k25_and_architectures_are_accepted_everywhere():
    """kimi_k25 (multimodal wrapper of DeepSeek-V3) follows the DeepSeek rules on every engine."""
    for eng in rules.ENGINES:
        assert resolve(eng, "kimi_k25").family == "deepseek"
    assert rules.family_of("DeepseekV3ForCausalLM") == "deepseek"


# --- the appliers ------------------------------------------------------------------------------------

def test_duplicates_capture_once_and_deepseek_0_5_18_leaves_a_slot():
    for eng, mt in (("vllm", "llama"), ("sglang", "llama"), ("trtllm", "llama")):
        out = positions_for_ids(resolve(eng, mt), [3, 3], N)
        assert out[1].effect == "duplicate"
    assert "empty slot" in positions_for_ids(resolve("sglang", "deepseek_v3", "0.5.18"), [3, 3], N)[1].note


def test_default_ids_capture_the_default_positions_everywhere():
    for eng in rules.ENGINES:
        for mt in _TYPE.values():
            rule = resolve(eng, mt)
            for n in (8, 12, 32, 61):
                got = [o.position.p for o in positions_for_ids(rule, default_ids(rule, n), n)]
                assert got == default_aux_positions(n), (eng, mt, n)
    assert default_ids(resolve("sglang", "llama"), 61) == [1, 29, 57]
    with pytest.raises(ForensicsError, match="N > 5"):
        default_ids(resolve("trtllm", "llama"), 5)


def test_ids_for_positions_concrete_cases():
    """Llama N=12 P=[3,7,10]: SGLang [2,6,9], vLLM [3,7,10], TRT-LLM [2,6,9]; embedding and p=N."""
    assert ids_for_positions(resolve("sglang", "llama"), [3, 7, 10], N).ids == [2, 6, 9]
    assert ids_for_positions(resolve("vllm", "llama"), [3, 7, 10], N).ids == [3, 7, 10]
    assert ids_for_positions(resolve("trtllm", "llama"), [3, 7, 10], N).ids == [2, 6, 9]
    assert ids_for_positions(resolve("sglang", "llama", "0.5.21"), [0, 3], N).ids is None
    assert ids_for_positions(resolve("sglang", "llama", "0.5.22"), [0, 3], N).ids == [-1, 2]
    assert ids_for_positions(resolve("vllm", "llama", "0.17.1"), [0, 3], N).ids is None
    assert ids_for_positions(resolve("vllm", "llama", "0.18.0"), [0, 3], N).ids == [0, 3]
    plan = ids_for_positions(resolve("sglang", "llama"), [3, N], N)
    assert plan.ids is None and any(f"p={N}" in r for r in plan.reasons)
    assert ids_for_positions(resolve("sglang", "gpt_oss"), [3, N], N).ids == [2, N - 1]
    assert ids_for_positions(resolve("sglang", "kimi_k2", "0.5.13"), [2, 30, 58], 61).ids == [1, 29, 57]
    assert ids_for_positions(resolve("sglang", "kimi_k2", "0.5.13"), [3, 31, 59], 61).ids == [3, 31, 59]
    assert ids_for_positions(resolve("sglang", "kimi_k2", "0.5.13"), [1, 5, 9], N).ids is None
    assert ids_for_positions(resolve("sglang", "kimi_k2", "0.5.3"), [2, 5], N).ids is None


def test_descending_duplicate_and_out_of_range_positions_rejected():
    for eng in rules.ENGINES:
        rule = resolve(eng, "llama")
        assert any("ascending" in r for r in ids_for_positions(rule, [10, 3, 7], N).reasons)
        assert ids_for_positions(rule, [3, 3, 7], N).ids is None
        assert ids_for_positions(rule, [3, 13], N).ids is None


def test_concat_order_default_is_by_layer():
    out = positions_for_ids(resolve("vllm", "llama"), [9, 2, 6], N)
    assert concat_order(out) == [Position(2), Position(6), Position(9)]


def test_bad_arguments_are_forensics_errors():
    with pytest.raises(ForensicsError):
        positions_for_ids(resolve("vllm"), [1, "2"], N)  # type: ignore[list-item]
    with pytest.raises(ForensicsError):
        ids_for_positions(resolve("vllm"), [1, 2], 0)


_ALL_RULES = [resolve(e, mt, None if e == "trtllm" else v, mode=m)
              for e, mt, v, m in (
                  [("sglang", t, v, None) for t in _TYPE.values()
                   for v in ("0.5.12.post1", "0.5.13", "0.5.14", "0.5.17", "0.5.23")]
                  + [("vllm", t, v, None) for t in _TYPE.values() for v in ("0.17.1", "0.18.0", "0.26.0")]
                  + [("trtllm", "llama", None, m) for m in ("one-model", "two-model")])]


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=6, max_value=96).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.integers(0, n), min_size=1, max_size=6,
                                             unique=True).map(sorted))))
def test_round_trip_every_valid_ascending_list(case):
    """Whenever ids_for_positions answers, positions_for_ids maps the ids back onto P."""
    n, pos = case
    for rule in _ALL_RULES:
        plan = ids_for_positions(rule, pos, n)
        if plan.ids is None:
            assert plan.reasons
            continue
        assert [o.position for o in positions_for_ids(rule, plan.ids, n)] == [Position(p) for p in pos]


def test_trainer_final_expectation():
    assert trainer_final_expectation("SpecForge").startswith("post-norm")
    assert trainer_final_expectation("speculators").startswith("raw")
    with pytest.raises(ForensicsError, match="specforge or speculators"):
        trainer_final_expectation("eagle")
