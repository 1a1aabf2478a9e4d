"""Each check computes only what it needs: the coverage sample is taken before any lm_head product, the lm_head
is streamed a block at a time, and the answers equal the whole computation's."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from eagleforensics.arrays import to_torch
from eagleforensics.checks import nexttokens
from eagleforensics.checks.base import Artifacts, DoctorInputs
from eagleforensics.drafter.replay import greedy_rows, head_logits
from eagleforensics.io.modeldir import ModelDir

SAMPLES = Path(__file__).resolve().parents[1] / "data_samples"
INPUTS = DoctorInputs(drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target"),
                      train=str(SAMPLES / "record_layer_outputs.pt"), capture=str(SAMPLES / "capture.pt"))


def test_coverage_samples_rows_before_the_lm_head_product(monkeypatch: pytest.MonkeyPatch) -> None:
    full_art = Artifacts(INPUTS)
    full = nexttokens.record_tokens(full_art), nexttokens.capture_tokens(full_art)
    seen: list[int] = []
    real = nexttokens.greedy

    def counting(final: np.ndarray, head: object, device: str = "cpu") -> np.ndarray:
        seen.append(final.shape[0])
        return real(final, head, device)
    monkeypatch.setattr(nexttokens, "greedy", counting)
    monkeypatch.setattr(nexttokens, "MAX_TOKENS", 10)
    art = Artifacts(INPUTS)
    rec, cap = nexttokens.record_tokens(art), nexttokens.capture_tokens(art)
    assert seen == [20]  # one pass over the lm_head for both sources, 10 sampled rows each (the record has 24)
    assert full[0].tokens.size == 24 and full[1].tokens.size == 40
    np.testing.assert_array_equal(rec.tokens, full[0].tokens[:10])  # the same tokens the whole computation kept
    np.testing.assert_array_equal(cap.tokens, full[1].tokens[:10])
    assert (rec.how, cap.how) == (full[0].how, full[1].how)


def test_streamed_greedy_equals_one_product() -> None:
    """Block by block (stored dtype, widened per block) against one float32 product of the whole head."""
    md = ModelDir(SAMPLES / "target")
    head = to_torch(md.read("lm_head.weight")).to(torch.bfloat16)  # kept as a bf16 checkpoint stores it
    x = torch.randn(37, head.shape[1], generator=torch.Generator().manual_seed(0))
    x[5, 3] = float("nan")
    whole = (x @ head.float().T).argmax(-1)
    for block in (7, 64, 100000):
        got = greedy_rows(lambda a, b: x[a:b], 37, head, block=block, row_block=16)
        assert got[5] == -1
        keep = torch.arange(37) != 5
        assert torch.equal(got[keep], whole[keep])
        torch.testing.assert_close(head_logits(x, head, block=block), x @ head.float().T, rtol=1e-5, atol=1e-5,
                                   equal_nan=True)
    stored = to_torch(md.read("lm_head.weight"))  # float32 in the sample: streamed from its shard as stored
    streamed = nexttokens.greedy(x.numpy(), nexttokens.TargetHead(md, "lm_head.weight", tuple(stored.shape), None,
                                                                  1e-6))
    np.testing.assert_array_equal(streamed[keep.numpy()], (x @ stored.T).argmax(-1)[keep].numpy())


def test_temperature_scan_on_threads_gives_the_plain_loops_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's 16 temperatures run on threads for large blocks: every figure equal to the one-thread loop."""
    from eagleforensics.dataaudit import agreement as ag

    md = ModelDir(SAMPLES / "target")
    head = ag.TargetHead(ag.head_spec(md), md)
    gen = np.random.default_rng(0)
    x = head.normalize(gen.standard_normal((300, head.spec.hidden)).astype(np.float32))
    nxt = gen.integers(0, head.spec.vocab, 300)
    monkeypatch.setattr(ag, "PARALLEL_MIN", 1 << 60)
    plain = head.score(x, nxt)
    monkeypatch.setattr(ag, "PARALLEL_MIN", 0)
    pooled = head.score(x, nxt)  # the real pool where this machine has 2+ cores
    monkeypatch.setattr(ag, "_each", lambda fn, count, size: list(
        __import__("concurrent.futures").futures.ThreadPoolExecutor(4).map(fn, reversed(range(count)))))
    threaded = head.score(x, nxt)
    for name in ("agree", "logp", "rank", "entropy", "var", "loglik_t", "top1_t", "pit_t"):
        np.testing.assert_array_equal(getattr(threaded, name), getattr(plain, name), err_msg=name)
        np.testing.assert_array_equal(getattr(pooled, name), getattr(plain, name), err_msg=name)


def test_disk_rows_gather_the_rows_a_tensor_would(tmp_path: Path) -> None:
    """The lazy embedding / lm_head: gathers, blocks and a NaN found as the head streams, as the whole tensor."""
    import shutil

    from safetensors.torch import load_file, save_file

    from eagleforensics.errors import ForensicsError
    from eagleforensics.io.diskrows import disk_rows

    md = ModelDir(SAMPLES / "target")
    whole = to_torch(md.read("model.embed_tokens.weight"))
    rows = disk_rows(md, "model.embed_tokens.weight")
    ids = torch.tensor([[5, 6, 7, 5], [0, 511, 8, 6]])
    assert torch.equal(rows[ids], whole[ids]) and rows.to("cpu") is rows and rows.shape == whole.shape
    assert torch.equal(rows.block(100, 140), whole[100:140])
    t = tmp_path / "t"
    shutil.copytree(SAMPLES / "target", t)
    shard = t / "model-00002-of-00002.safetensors"
    tensors = load_file(str(shard))
    tensors["lm_head.weight"][300, 2] = float("inf")
    save_file(tensors, str(shard))
    head = disk_rows(ModelDir(t), "lm_head.weight")
    with pytest.raises(ForensicsError, match="lm_head.weight holds NaN or Inf"):
        greedy_rows(lambda a, b: torch.ones(b - a, head.shape[1]), 3, head, block=64)


def test_agreement_on_a_torch_device_matches_the_numpy_pass() -> None:
    """--device cuda's audit pass (run here on the CPU through torch): every figure within 1e-5 of numpy's."""
    from eagleforensics.dataaudit import agreement as ag
    from eagleforensics.dataaudit.agreement_torch import score_block

    md = ModelDir(SAMPLES / "target")
    head = ag.TargetHead(ag.head_spec(md), md)
    gen = np.random.default_rng(1)
    x = head.normalize(gen.standard_normal((200, head.spec.hidden)).astype(np.float32))
    nxt = gen.integers(0, head.spec.vocab, 200)
    want = head.score(x, nxt)
    got = ag.TokenScores.empty(200)
    score_block(head, x, nxt, head._true_logits(x, nxt), got, "cpu", ag.TEMPERATURES)
    np.testing.assert_array_equal(got.rank, want.rank)
    for name in ("logp", "entropy", "var", "loglik_t", "top1_t", "pit_t"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-6, err_msg=name)
    assert ag.Agreement.of(got).verdict == ag.Agreement.of(want).verdict


def test_deferred_finite_check_says_what_load_drafter_says() -> None:
    """--device cuda looks for NaN/Inf once the weights are on the device: the same one line as on the host."""
    from eagleforensics.errors import ForensicsError
    from eagleforensics.io.drafter import check_finite, load_drafter

    drafter = load_drafter(SAMPLES / "drafter", target=SAMPLES / "target", lazy=True, check_finite=False)
    check_finite(drafter.weights, SAMPLES / "drafter")  # the sample is finite
    w = dict(drafter.weights)
    w["fc.weight"] = w["fc.weight"].clone().to(torch.bfloat16)
    w["fc.weight"][0, 0] = float("nan")
    with pytest.raises(ForensicsError, match="tensor fc.weight holds NaN or Inf"):
        check_finite(w, SAMPLES / "drafter")
