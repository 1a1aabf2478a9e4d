"""Replay against what trainers and servers measure: SpecForge's acc_k, sampling acceptance, SGLang's tree.

``tests/fixtures/specforge`` was written by ``scripts/specforge_crosscheck.py``: a drafter trained with
SpecForge 0.2.0's own training forward on a tiny target's greedy responses (wiring p3, p5, p6), six
held-out SpecForge records (ids, loss mask over the response, post-norm final, aux states) with the
capture sweep of each (bf16, no input_ids), and the acc_k / acceptance_rate figures SpecForge's
forward produced on them for the trained wiring and two wrong ones. SpecForge is not needed here.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache

import pytest
import torch
from click.testing import CliRunner

from eagleforensics.arrays import to_torch
from eagleforensics.cli import main
from eagleforensics.drafter.replay import (DraftForward, TargetSide, counted_rows, replay_chain, target_tokens, tree_candidates, tree_depths)
from eagleforensics.io.capture import load_capture
from eagleforensics.io.drafter import load_drafter, load_target
from eagleforensics.positions import Position
from eagleforensics.replay import parse_wiring, run_replay

from .plaindraft import plain_logits
from .torchthreads import one_thread  # noqa: F401  (autouse)
from .realdata import ROOT

FIX = ROOT / "tests" / "fixtures" / "specforge"
FIGURES = json.loads((FIX / "specforge_acc.json").read_text())
TTT = FIGURES["ttt_length"]
WIRINGS = list(FIGURES["wirings"])


@lru_cache(maxsize=None)
def drafter():
    return load_drafter(FIX / "drafter", target=FIX / "target")


@lru_cache(maxsize=None)
def head():
    return load_target(FIX / "target")


@lru_cache(maxsize=None)
def case(record: str, wiring: str):
    """(forward, prefix, target tokens y, loss mask, aux [T, 3H], final [T, H], ids) for one record and wiring."""
    rec = torch.load(FIX / f"{record}.ckpt")
    cap = load_capture(FIX / f"{record}.safetensors")
    aux = torch.cat([to_torch(cap.read(Position(p.p))).float() for p in parse_wiring(wiring)], -1)
    final = rec["hidden_state"][0].float()
    ids = rec["input_ids"]
    fwd = DraftForward.of(drafter())
    with torch.no_grad():
        h0, _ = fwd.project_rows(aux, len(ids))
        pre = fwd.prefix(h0, ids)
    return fwd, pre, target_tokens(final, head().lm_head), rec["loss_mask"], aux, final, ids


# -- SpecForge's acc_k ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def replays():
    """replay on each held-out capture, the record as --train (its loss mask and, the capture having none, its ids)."""
    return [run_replay(FIX / "drafter", FIX / f"{name}.safetensors", target=FIX / "target", train=FIX / f"{name}.ckpt",
                       wirings=WIRINGS, steps=TTT) for name in FIGURES["records"]]


def test_acc_with_the_loss_mask_equals_specforge_acc_k(replays):
    """Pooled over the held-out records, replay's acc@k is SpecForge's acc_k within 0.01 for the trained wiring and
    both wrong ones; the rows counted are SpecForge's denominators, record by record."""
    assert all(r.trained is not None and r.trained.label == FIGURES["trained"] for r in replays)
    assert all(r.tokens_from == "record" and r.loss_mask is not None for r in replays)
    for label in WIRINGS:
        want = FIGURES["wirings"][label]
        rows = [next(w for w in rep.results if w.label == label) for rep in replays]
        for j, w in enumerate(rows):
            assert w.acc_rows == want["denominator"][j], (label, j)
            assert [round(a * n) for a, n in zip(w.acc, w.acc_rows)] == want["correct"][j], (label, j)
        for k in range(TTT):
            pooled = sum(w.acc[k] * w.acc_rows[k] for w in rows) / sum(w.acc_rows[k] for w in rows)
            assert abs(pooled - want["acc"][k]) <= 0.01, (label, k, pooled, want["acc"][k])
    trained, wrong = (FIGURES["wirings"][x]["acc"][0] for x in (FIGURES["trained"], "p2,p4,p5"))
    assert trained - wrong > 0.1  # the wrong wiring does cost acceptance: the comparison is not between equals


def test_counting_every_row_would_not_match(replays):
    """Without the mask the figures differ from SpecForge's: the mask is what makes them comparable."""
    name = FIGURES["records"][1]
    rep = run_replay(FIX / "drafter", FIX / f"{name}.safetensors", target=FIX / "target", train=FIX / f"{name}.ckpt",
                     wirings=WIRINGS, steps=TTT)
    cap = load_capture(FIX / f"{name}.safetensors")
    assert cap.input_ids is None  # the ids came from the record
    masked = next(w for w in rep.results if w.label == FIGURES["trained"])
    assert masked.acc_rows[0] == FIGURES["wirings"][FIGURES["trained"]]["denominator"][1][0]
    assert masked.acc_rows[0] < rep.tokens - 1  # fewer rows than every row with a target
    assert "supervised rows only" in rep.counting and "loss_mask[t+k-1]" in rep.counting


def test_a_record_given_as_the_capture_replays_its_own_aux_states(replays):
    """``replay DRAFTER RECORD``: the record's aux states (the trained wiring), ids, mask and final state."""
    for j, name in enumerate(FIGURES["records"]):
        rep = run_replay(FIX / "drafter", FIX / f"{name}.ckpt", target=FIX / "target", steps=TTT)
        assert rep.record_as_capture and len(rep.results) == 1
        mine = rep.results[0]
        assert mine.acc_rows == FIGURES["wirings"][FIGURES["trained"]]["denominator"][j]
        assert mine.acc == next(w for w in replays[j].results if w.label == FIGURES["trained"]).acc
    out = CliRunner().invoke(main, ["replay", str(FIX / "drafter"), str(FIX / "heldout_0.ckpt"), "--target",
                                    str(FIX / "target"), "--wiring", "p0,p2,p4"])
    assert out.exit_code == 2 and "training record" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_sampled_acceptance_at_t1_equals_specforge_acceptance_rate():
    """SpecForge logs sum(min(p, q)) at temperature 1 over its position mask (loss mask and the target token in the
    draft vocabulary): replay's sampled-draft acceptance over the same rows, record by record."""
    in_vocab = drafter().weights["t2d"].bool()
    for label in WIRINGS:
        for j, name in enumerate(FIGURES["records"]):
            fwd, pre, y, mask, _, final, ids = case(name, label)
            run = replay_chain(fwd, pre, TTT, target=TargetSide(lambda a, b: final[a:b], len(ids), head().lm_head),
                               temperature=1.0)
            rows = counted_rows(len(ids), TTT, y, None, mask)
            for k in range(1, TTT + 1):
                ahead = torch.cat([y[k:], y.new_full((k,), -1)])
                where = rows.acc[k - 1] & (ahead >= 0) & in_vocab[ahead.clamp(min=0)]
                got = float(run.alpha_sampled[k - 1][where].double().mean())
                assert got == pytest.approx(FIGURES["wirings"][label]["acceptance_rate"][j][k - 1], abs=1e-4)


# -- temperature against Monte Carlo rejection sampling ---------------------------------------------------------
def test_expected_acceptance_at_temperature_matches_monte_carlo():
    """The same two distributions sampled: drafts x ~ q accepted with min(1, p/q) (rejection sampling), greedy
    drafts accepted with probability p(draft); chains of 3 steps, each step resampled. Within 4 standard errors."""
    temperature, top_p = 0.3, 0.9
    fwd, pre, y, mask, _, final, ids = case(FIGURES["records"][2], FIGURES["trained"])
    side = TargetSide(lambda a, b: final[a:b], len(ids), head().lm_head)
    run = replay_chain(fwd, pre, 3, target=side, temperature=temperature, top_p=top_p)
    logits = list(fwd.chain(pre, 3, 0, len(ids)))
    gen = torch.Generator().manual_seed(0)
    draws = 4000
    rows = [t for t in range(12, 40, 3)]
    alphas_s, alphas_g = [], []
    chain_mc, chain_an = [], []
    for t in rows:
        alive = torch.ones(draws, dtype=torch.bool)
        for k in range(1, 4):
            p = side.probs(t + k, t + k + 1, temperature, top_p)[0]
            q = torch.softmax(logits[k - 1][t] / temperature, -1)
            pd = p[fwd.draft_ids]  # target probability of each draft token
            x = torch.multinomial(q, draws, replacement=True, generator=gen)
            u = torch.rand(draws, generator=gen)
            accepted = u < (pd[x] / q[x]).clamp(max=1)
            analytic = float(torch.minimum(pd, q).sum())
            assert float(run.alpha_sampled[k - 1, t]) == pytest.approx(analytic, rel=1e-5, abs=1e-7)
            se = math.sqrt(max(analytic * (1 - analytic), 1e-4) / draws)
            assert abs(float(accepted.float().mean()) - analytic) < 4 * se, (t, k)
            greedy = float(p[fwd.to_target(logits[k - 1][t].argmax())])
            assert float(run.alpha_greedy[k - 1, t]) == pytest.approx(greedy, rel=1e-5, abs=1e-7)
            alive &= accepted
            alphas_s.append(analytic)
            alphas_g.append(greedy)
        chain_mc.append(float(alive.float().mean()))
        chain_an.append(float(run.alpha_sampled[:, t].double().prod()))
    assert abs(sum(chain_mc) / len(rows) - sum(chain_an) / len(rows)) < 4 * math.sqrt(0.25 / (draws * len(rows)))
    assert 0.02 < min(alphas_s) and max(alphas_s) < 0.98 and max(alphas_g) > 0  # not degenerate distributions


def test_top_p_renormalises_the_target():
    from eagleforensics.drafter.replay import top_p_renorm

    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert torch.allclose(top_p_renorm(p, 0.7), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.allclose(top_p_renorm(p, 0.85), torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    assert torch.equal(top_p_renorm(p, 1.0), p)


# -- SGLang's tree ---------------------------------------------------------------------------------------------
def brute_tree(fwd, aux, ids, y, t, topk, steps, draft_tokens, nodes_out=None):
    """SGLang's tree for start row t, node by node with the plain forward; None when a selection is a near tie.
    ``nodes_out`` (a list) receives every scored node as (token path, score)."""
    d = drafter()

    cache: dict = {}

    def children(path):
        logits = plain_logits(d, aux, ids, t, path=path, cache=cache)[-1]
        p = torch.softmax(logits, -1)
        top = p.topk(topk + 1)
        if topk < p.shape[0] and float(top.values[topk - 1] - top.values[topk]) < 1e-6:
            raise _Tie
        return [(float(v), int(fwd.to_target(i))) for v, i in zip(top.values[:topk], top.indices[:topk])]

    try:
        nodes = [{"path": [tok], "score": pr, "parent": None, "depth": 1} for pr, tok in children([])]
        frontier = list(nodes)
        for level in range(2, steps + 1):
            kids = [{"path": n["path"] + [tok], "score": n["score"] * pr, "parent": id(n), "depth": level}
                    for n in frontier for pr, tok in children(n["path"])]
            nodes += kids
            frontier = _best(kids, topk) if level < steps else []
        if nodes_out is not None:
            nodes_out.extend((tuple(n["path"]), n["score"]) for n in nodes)
        keep = _best(nodes, draft_tokens - 1)
    except _Tie:
        return None
    kept = {id(n) for n in keep}
    cur, depth = None, 0
    for level in range(1, steps + 1):
        hit = [n for n in keep if n["parent"] == cur and n["depth"] == level and n["path"][-1] == int(y[t + level])]
        if not hit:
            break
        cur, depth = id(hit[0]), depth + 1
    assert all(n["parent"] is None or n["parent"] in kept or True for n in keep)
    return depth


class _Tie(Exception):
    pass


def _best(nodes, n):
    ranked = sorted(nodes, key=lambda x: -x["score"])
    if len(ranked) > n and ranked[n - 1]["score"] - ranked[n]["score"] < 1e-7 * max(ranked[n - 1]["score"], 1e-30):
        raise _Tie
    return ranked[:n]


@pytest.mark.parametrize("topk,draft_tokens", [(2, 4), (3, 7)])
def test_tree_equals_a_brute_force_tree_walk(topk, draft_tokens):
    steps = 3
    fwd, pre, y, mask, aux, _, ids = case(FIGURES["records"][1], FIGURES["trained"])
    rows = [13, 19, 21, 22, 27, 33, 41]
    pick = torch.zeros(len(ids), dtype=torch.bool)
    pick[rows] = True
    got = tree_depths(fwd, pre, y, steps, topk, draft_tokens, pick, chunk=3)
    with torch.no_grad():
        cands = tree_candidates(fwd, pre, torch.tensor(rows), steps, topk)
    compared = 0
    for i, t in enumerate(rows):
        nodes: list = []
        want = brute_tree(fwd, aux, ids, y, t, topk, steps, draft_tokens, nodes)
        if want is None:
            continue
        assert int(got[t]) == want, t
        compared += 1
        paths = []  # every scored node of replay's tree, as (token path, score), against the brute force's
        for c in range(cands.scores.shape[1]):
            path, j = [], c
            while j >= 0:
                path.append(int(cands.tokens[i, j]))
                j = int(cands.parents[i, j])
            paths.append((tuple(reversed(path)), float(cands.scores[i, c])))
        assert sorted(p for p, _ in paths) == sorted(p for p, _ in nodes), t
        mine = dict(paths)
        for path, score in nodes:
            assert mine[path] == pytest.approx(score, rel=1e-4), (t, path)
    assert compared >= 5
    assert int(got[pick].sum()) > 0  # some row accepts something: the walk is exercised


def test_tree_is_never_below_the_chain_and_never_above_its_bound():
    """Over the held-out records' supervised start rows, topk 2..4:

    * with the draft tokens to keep every candidate, the tree accepts at least what the chain (the same walk with
      topk 1) accepts, row by row; with a budget of at least topk x steps nodes, at least as much on average;
    * never more than the top-k bound (the target token in the drafter's top-k along the chain), row by row;
    * topk 1 is the greedy chain itself where the text is the target's own greedy output.
    With fewer draft tokens SGLang keeps the best-scored nodes, and a drafter unsure of its tokens (this one's top
    probability is under 1%) loses the chain's deep nodes to shallow ones: the tree can then fall below the chain,
    so the tree figure is not a lower bound (README).
    """
    steps = 3
    total = {}
    for name in FIGURES["records"][:4]:
        fwd, pre, y, mask, _, _, ids = case(name, FIGURES["trained"])
        rows = counted_rows(len(ids), steps, y, None, mask)
        chain = tree_depths(fwd, pre, y, steps, 1, steps + 1, rows.starts)
        tf = replay_chain(fwd, pre, steps, y=y)
        ok = torch.stack([tf.drafts[k - 1] == torch.cat([y[k:], y.new_full((k,), -1)]) for k in range(1, steps + 1)])
        greedy = torch.stack([torch.cat([ids[k + 1:], ids.new_zeros(k + 1)]) == torch.cat([y[k:], y.new_full((k,), -1)])
                              for k in range(steps)]).all(0)
        same = rows.starts & greedy
        assert int(same.sum()) >= int(rows.starts.sum()) // 2
        assert torch.equal(chain[same], ok.long().cumprod(0).sum(0)[same])  # greedy text: free chain = teacher-forced
        for topk, draft_tokens in ((2, 4), (2, 7), (3, 10), (2, 11), (4, 37)):
            tree = tree_depths(fwd, pre, y, steps, topk, draft_tokens, rows.starts)
            hit = tf.in_topk(topk).long().cumprod(0).sum(0).clamp(max=draft_tokens - 1)
            assert bool((tree[same] <= hit[same]).all()), (name, topk)
            if draft_tokens - 1 == topk + (steps - 1) * topk * topk:  # every candidate kept
                assert bool((tree[rows.starts] >= chain[rows.starts]).all()), (name, topk)
            sums = total.setdefault((topk, draft_tokens), [0, 0])
            sums[0] += int(tree[rows.starts].sum()) - int(chain[rows.starts].sum())
            sums[1] += int((tree[rows.starts] < chain[rows.starts]).sum())
    for (topk, draft_tokens), (gain, below) in total.items():
        if draft_tokens - 1 >= topk * steps:
            assert gain >= 0, (topk, draft_tokens)
    assert total[(2, 4)][1] > 0  # the small budget does drop chain nodes: the caveat is real, not hypothetical


def test_tree_figures_in_the_report_and_cli():
    out = CliRunner().invoke(main, ["replay", str(FIX / "drafter"), str(FIX / "heldout_3.safetensors"), "--target",
                                    str(FIX / "target"), "--train", str(FIX / "heldout_3.ckpt"), "--steps", "3",
                                    "--topk", "3", "--draft-tokens", "8", "--temperature", "0.7", "--top-p", "0.95",
                                    "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["topk"] == 3 and data["draft_tokens"] == 8 and data["temperature"] == 0.7
    for w in data["wirings"]:
        tree, s = w["tree"], w["sampling"]
        assert tree["chain_accept_length"] <= tree["accept_length"] <= tree["bound"]
        assert 1.0 <= s["greedy_drafts"]["accept_length"] <= 1.0 + 3 and len(s["sampled_drafts"]["reach"]) == 3
    text = CliRunner().invoke(main, ["replay", str(FIX / "drafter"), str(FIX / "heldout_3.ckpt"), "--target",
                                     str(FIX / "target"), "--topk", "2", "--draft-tokens", "5"]).stdout
    assert "SGLang tree: topk 2, 5 draft tokens" in text
    for bad in (["--topk", "2"], ["--draft-tokens", "5"], ["--topk", "2", "--draft-tokens", "99"],
                ["--temperature", "0.5", "--target", "/nonexistent/x"]):
        res = CliRunner().invoke(main, ["replay", str(FIX / "drafter"), str(FIX / "heldout_3.ckpt"), *bad])
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, (bad, res.output)
