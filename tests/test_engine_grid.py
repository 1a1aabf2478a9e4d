"""The grid of issue 11: draft kinds x engine versions x families, against answers worked out by
hand from docs/conventions.md (and the wheels the rules cite). Pure metadata: every
cell is one ``audit_config`` on a small config file, no tensors.

N = 61 (Kimi-K2's depth) for every family. Draft kinds: nested [2,30,58] (SpecForge), top-level
[3,31,59] (speculators), both keys with the same list [2,30,58], both keys disagreeing (top
[3,31,59], nested [2,30,58]), no ids, an empty nested list, nested [2,30,58] with
use_aux_hidden_state false; TensorRT-LLM YAML [-1,2,30] in one- and two-model mode.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from eagleforensics.engines.draftconfig import NESTED_KEY, TOP_KEY, YAML_KEY, audit_config

from .drafts import draft_config, trtllm_mode_yaml

N = 61
KINDS = ("nested", "top", "agree", "disagree", "none", "empty", "off")
FAMILIES = ("llama", "qwen3", "qwen3_moe", "deepseek_v3", "kimi_k2", "gpt_oss")
DS = ("deepseek_v3", "kimi_k2")

# What a cell serves: (key read, positions served, capture off)
S = (NESTED_KEY, [3, 31, 59], False)   # nested ids read with +1
V = (NESTED_KEY, [2, 30, 58], False)   # nested ids read verbatim (SGLang DeepSeek >= 0.5.13, vLLM)
D = (None, [2, 30, 58], False)         # no id read: the default p [2, N//2, N-3]
T = (TOP_KEY, [3, 31, 59], False)      # top-level [3,31,59] read, p = k
TV = (TOP_KEY, [2, 30, 58], False)     # top-level [2,30,58] read, p = k
E = (NESTED_KEY, [], False)            # SGLang: empty nested list, nothing captured
O = "off"                              # use_aux_hidden_state false honoured: no aux capture
U = "unsupported"                      # no EAGLE-3 capture for the family: serving fails
S_ = (NESTED_KEY, [3, 31, 59], False)  # the flag is NOT read by this version: capture goes on

SGL_PLUS1 = (S, D, S, S, D, E, O)
SGL_OLD = (S, D, S, S, D, E, S_)       # 0.5.3 / 0.5.4.post2 do not read use_aux_hidden_state
SGL_VERBATIM = (V, D, V, V, D, E, O)
VLLM_TOP = (D, T, TV, T, D, D, O)      # top-level only (V1 <= 0.21, V2 < 0.28 default)
VLLM_BOTH = (V, T, TV, T, D, D, O)     # V1 >= 0.22: top-level, then nested
VLLM_V2_OLD = (D, T, TV, T, D, D, (None, [2, 30, 58], False))  # V2 before 0.33 ignores the flag
UNSUP = (U,) * 7

# (engine, version, runner) -> family -> expected row over KINDS
GRID = {
    ("sglang", "0.5.3", None): {f: UNSUP if f in DS else SGL_OLD for f in FAMILIES},
    ("sglang", "0.5.4.post2", None): {f: SGL_OLD for f in FAMILIES},
    ("sglang", "0.5.12.post1", None): {f: SGL_PLUS1 for f in FAMILIES},
    ("sglang", "0.5.13", None): {f: SGL_VERBATIM if f in DS else SGL_PLUS1 for f in FAMILIES},
    ("sglang", "0.5.23", None): {f: SGL_VERBATIM if f in DS else SGL_PLUS1 for f in FAMILIES},
    ("vllm", "0.11.0", None): {f: UNSUP if f in DS else (D, D, D, D, D, D, D) for f in FAMILIES},
    ("vllm", "0.17.1", None): {f: UNSUP if f in DS else VLLM_TOP for f in FAMILIES},
    # 0.22: the V2 runner is the default for Qwen3ForCausalLM only; everything else runs V1
    ("vllm", "0.22.0", None): {f: VLLM_V2_OLD if f == "qwen3" else VLLM_BOTH for f in FAMILIES},
    # 0.28: V2 for non-MoE (llama, qwen3); DeepSeek-V3/Kimi, Qwen3-MoE, gpt-oss stay V1
    ("vllm", "0.28.0", None): {f: VLLM_V2_OLD if f in ("llama", "qwen3") else VLLM_BOTH
                               for f in FAMILIES},
    ("vllm", "0.33.0", None): {f: VLLM_TOP for f in FAMILIES},
    ("vllm", "0.33.0", "v1"): {f: VLLM_BOTH for f in FAMILIES},
    # 0.34.0 (read): no V1 runner any more; the V2 answers hold, a nested-only draft still gets the default
    ("vllm", "0.34.0", None): {f: VLLM_TOP for f in FAMILIES},
    ("vllm", "0.34.0", "v2"): {f: VLLM_TOP for f in FAMILIES},
}


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("grid")
    return {
        "nested": draft_config(tmp, "nested", nested=[2, 30, 58]),
        "top": draft_config(tmp, "top", top=[3, 31, 59]),
        "agree": draft_config(tmp, "agree", top=[2, 30, 58], nested=[2, 30, 58]),
        "disagree": draft_config(tmp, "disagree", top=[3, 31, 59], nested=[2, 30, 58]),
        "none": draft_config(tmp, "none"),
        "empty": draft_config(tmp, "empty", nested=[]),
        "off": draft_config(tmp, "off", nested=[2, 30, 58], use_aux=False),
        "one": trtllm_mode_yaml(tmp, [-1, 2, 30], True, "one.yaml"),
        "two": trtllm_mode_yaml(tmp, [-1, 2, 30], False, "two.yaml"),
    }


CELLS = [(eng, ver, run, fam) for (eng, ver, run), fams in GRID.items() for fam in fams]


@pytest.mark.parametrize("engine,version,runner,family", CELLS,
                         ids=[f"{e}-{v}-{r or 'default'}-{f}" for e, v, r, f in CELLS])
def test_grid(drafts, engine, version, runner, family):
    """Each draft kind on one engine version and family gives the hand-worked answer."""
    want_row = GRID[(engine, version, runner)][family]
    for kind, want in zip(KINDS, want_row):
        a = audit_config(drafts[kind], engine, engine_version=version, model_type=family,
                         num_layers=N, vllm_runner=runner)
        got_served = [q.p for q in a.served]
        codes = {f.code for f in a.findings}
        where = (kind, engine, version, family)
        if want == U:
            assert got_served == [] and "engine-cannot-serve" in codes, where
        elif want == O:
            assert a.capture_off and got_served == [] and "aux-capture-off" in codes, where
        else:
            assert (a.key_read, got_served, a.capture_off) == want, where
            if want == E:
                assert "empty-id-list" in codes and a.has_warnings, where
            if want[0] is None:
                assert "default-fallback" in codes, where


@pytest.mark.parametrize("family", FAMILIES)
def test_grid_trtllm_yaml_modes(drafts, family):
    """TRT-LLM [-1,2,30]: one-model (default) concatenates -1 first, two-model last."""
    one = audit_config(drafts["one"], "trtllm", model_type=family, num_layers=N)
    two = audit_config(drafts["two"], "trtllm", model_type=family, num_layers=N)
    assert one.key_read == two.key_read == YAML_KEY
    assert [q.label for q in one.served] == ["p61 post-norm", "p3", "p31"]
    assert [q.label for q in two.served] == ["p3", "p31", "p61 post-norm"]
    assert one.mode == "one-model" and two.mode == "two-model"
    assert "order-differs" in {f.code for f in two.findings}  # listed -1 first, served last
