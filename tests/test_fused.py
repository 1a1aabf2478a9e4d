"""The compiled (numba) scorer: the same numbers as the torch path on real captures of every dtype,
exact 16-bit widening, NaN/Inf rows, the fallback without numba, and a read-only install."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from eagleforensics.alignment import align
from eagleforensics.errors import ForensicsError
from eagleforensics.evidence import fused, match
from eagleforensics.evidence.identity import step_reader
from eagleforensics.evidence.norms import nonfinite_rows, row_summaries, token_norms
from eagleforensics.io.capture import load_capture
from eagleforensics.io.sweep import write_capture
from eagleforensics.positions import Position

from .realdata import ROOT, SAMPLES, N, _model, forward

pytestmark = pytest.mark.skipif(not fused.AVAILABLE, reason="numba is not installed")
FIELDS = ("score", "rel_diff", "max_abs", "norm_ratio", "per_token")


@pytest.fixture(autouse=True)
def always_compiled(monkeypatch):
    """Test captures are small: below ``MIN_BYTES`` a fresh process would leave them to torch. The kernels
    compile in this process (``EAGLEFORENSICS_FUSED=1``), whether or not this machine's cache is marked."""
    monkeypatch.setattr(fused, "MIN_BYTES", 0)
    monkeypatch.setattr(fused, "_MODE", "1")


MARKED = "from eagleforensics.evidence import kernelcache\nkernelcache.mark_compiled()\n"  # with KERNEL_DIR set


def _slots(run, dtype, nan_row=7):
    slots = [run.p(p).to(dtype).contiguous() for p in (2, N // 2 + 1, N - 2)] + [run.hs[N].to(dtype).contiguous()]
    slots[1] = slots[1].clone()
    slots[1][nan_row] = float("nan")
    return slots


def _both(monkeypatch, slots, cap, window, fit_candidates):
    """(compiled, torch) score matrices of the same call; asserts the compiled kernels really ran."""
    calls = []
    kern = fused.kernels()
    real = kern.direct
    monkeypatch.setattr(kern, "direct", lambda *a: calls.append(1) or real(*a))
    fit = [False, False, False, True]
    got = match.score_slots(slots, fit, cap.positions, cap, *window, fit_candidates=fit_candidates)
    assert calls, "the compiled path did not run"
    monkeypatch.setattr(fused, "AVAILABLE", False)
    ref = match.score_slots(slots, fit, cap.positions, cap, *window, fit_candidates=fit_candidates)
    monkeypatch.setattr(fused, "AVAILABLE", True)
    return got, ref


def _worst(got, ref) -> dict[str, float]:
    out = {}
    assert got.columns == ref.columns
    for name in FIELDS:
        a, b = getattr(got, name), getattr(ref, name)
        assert np.array_equal(np.isnan(a), np.isnan(b)), name
        out[name] = float(np.nanmax(np.abs(a - b))) if np.isfinite(a).any() else 0.0
    assert np.array_equal(got.tokens_used, ref.tokens_used)
    assert got.nonfinite_capture == ref.nonfinite_capture
    for p, v in ref.column_norms.items():
        np.testing.assert_allclose(got.column_norms[p], v, rtol=1e-6)
    return out


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_compiled_scores_equal_the_torch_path_on_every_capture_dtype(tmp_path, monkeypatch, family):
    """Real sweeps stored as bf16, fp16, fp32; bf16 and fp32 records with a NaN row; two token windows,
    candidate and exhaustive fitted columns: scores agree within 1e-6."""
    run = forward(family)
    worst: dict[str, float] = {}
    for dtype in ("bfloat16", "float16", "float32"):
        path = tmp_path / f"{dtype}.safetensors"
        write_capture(path, run.sweep, _model(family, 0), dtype=dtype)
        cap = load_capture(path)
        for sdtype in (torch.bfloat16, torch.float32):
            for window, fc in (((0, 0, 32), None), ((3, 5, 20), match.FIT_CANDIDATES)):
                got, ref = _both(monkeypatch, _slots(run, sdtype), cap, window, fc)
                for k, v in _worst(got, ref).items():
                    worst[k] = max(worst.get(k, 0.0), v)
    assert worst["score"] < 1e-6 and worst["rel_diff"] < 1e-6, worst
    assert worst["per_token"] < 1e-5 and worst["max_abs"] < 1e-5, worst


def test_pt_and_directory_captures_take_the_compiled_path_too(tmp_path, monkeypatch):
    """Zip .pt storages and one file per position are mapped like safetensors."""
    run = forward("qwen3")
    torch.save({"hidden_states": [h[None] for h in run.hs], "input_ids": run.ids.clone()}, tmp_path / "hf.pt")
    d = tmp_path / "dir"
    d.mkdir()
    for p in range(N + 1):
        save_file({"h": run.p(p).to(torch.bfloat16).contiguous()}, str(d / f"layer_{p}.safetensors"))
    for path, conv in ((tmp_path / "hf.pt", "hf"), (d, "vllm")):
        cap = load_capture(path, convention=conv, num_layers=N)
        got, ref = _both(monkeypatch, _slots(run, torch.bfloat16), cap, (0, 0, 32), None)
        assert _worst(got, ref)["score"] < 1e-6


def test_nan_and_inf_capture_rows_are_skipped_as_in_the_torch_path(tmp_path, monkeypatch):
    run = forward("llama")
    sweep = dict(run.sweep)
    sweep["hidden.3"] = sweep["hidden.3"].clone()
    sweep["hidden.3"][4] = float("nan")
    sweep["hidden.5"] = sweep["hidden.5"].clone()
    sweep["hidden.5"][9, 2] = float("inf")
    path = tmp_path / "bad.safetensors"
    write_capture(path, sweep, _model("llama", 0), dtype="bfloat16")
    cap = load_capture(path)
    got, ref = _both(monkeypatch, _slots(run, torch.bfloat16), cap, (0, 0, 32), None)
    assert _worst(got, ref)["score"] < 1e-6
    assert sum(got.nonfinite_capture.values()) == 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_16_bit_pattern_widens_exactly(dtype):
    """One value per row: the kernel's norm is |x| exactly (fp16 subnormals and values whose square
    overflows float32 included; below 1e-18 the square underflows), NaN/Inf rows are flagged."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype).reshape(-1, 1)
    norms, bad = fused.row_stats(x)
    want = x.float().abs().reshape(-1).numpy()
    finite = np.isfinite(want)
    assert np.array_equal(bad, ~finite)
    square_ok = finite & (want > 1e-18)
    assert square_ok.sum() > 30000 and np.array_equal(norms[square_ok], want[square_ok])
    assert np.isnan(norms[np.isnan(want)]).all() and np.isinf(norms[np.isinf(want)]).all()


@pytest.mark.parametrize("compiled", [True, False], ids=["kernel", "numpy"])
def test_record_norms_and_nonfinite_rows_match_torch(monkeypatch, compiled):
    """Both ways (the numpy path widens each block into reused buffers and looks for NaN/Inf only in
    rows whose sum is not finite): torch's norms, the NaN/Inf rows, and a row whose squares overflow
    float32 (1e20) counted finite."""
    monkeypatch.setattr(fused, "AVAILABLE", compiled)
    run = forward("qwen3")
    x = run.hs[4].to(torch.bfloat16).clone()
    x[3, 7] = float("nan")
    x[11, 0] = float("-inf")
    x[13] = 1e20
    for t in (x, x.float(), x.half(), torch.cat([x, x], 1)[:, 64:]):  # a strided slot view too
        ok = ~nonfinite_rows(t)
        np.testing.assert_allclose(token_norms(t)[ok & (np.arange(len(ok)) != 13)],
                                   torch.linalg.vector_norm(t.float(), dim=-1).numpy()[ok & (np.arange(len(ok)) != 13)],
                                   rtol=1e-6)
        want = [3, 11, 13] if t.dtype == torch.float16 else [3, 11]  # 1e20 is Inf in float16
        assert np.flatnonzero(nonfinite_rows(t)).tolist() == want


def test_a_records_slots_take_one_path_chosen_by_their_total_size(monkeypatch):
    """Each slot below the kernels' threshold, the four together above it (a large model at T=2048):
    all four go to the kernel (5x numpy's time there), and they agree with torch as the numpy path does."""
    run = forward("llama")
    slots = [run.hs[p].to(torch.bfloat16).contiguous() for p in (1, 2, 3, 4)]
    each = slots[0].element_size() * slots[0].numel()
    monkeypatch.setattr(fused, "MIN_BYTES", 3 * each)  # one slot is too small alone, the record is not
    used = []
    real = fused.kernels().row_stats

    def spy(*args):
        used.append(args[3])
        return real(*args)

    monkeypatch.setattr(fused.kernels(), "row_stats", spy)
    assert token_norms(slots[0]) is not None and used == []  # alone: numpy
    summaries = row_summaries(slots)
    assert len(used) == 4  # together: each slot through the kernel
    for t, (norms, bad) in zip(slots, summaries):
        np.testing.assert_allclose(norms, torch.linalg.vector_norm(t.float(), dim=-1).numpy(), rtol=1e-6)
        assert not bad.any()


def _child(code: str, env: dict[str, str], cwd: Path, drop: tuple[str, ...] = (),
           timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -c code`` in ``cwd``, with this process's environment less ``drop`` and plus ``env``."""
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def test_without_numba_the_torch_path_gives_the_same_answer(tmp_path):
    code = ("import sys, json; sys.modules['numba'] = None\nimport os; os.environ['EAGLEFORENSICS_FUSED'] = '1'\n"
            "from eagleforensics.alignment import align\nfrom eagleforensics.evidence import fused\n"
            "assert not fused.AVAILABLE\n"
            f"r = align({str(SAMPLES / 'record_wrong_fix.pt')!r}, {str(SAMPLES / 'capture_sweep.safetensors')!r})\n"
            "print(json.dumps([[m.position.p, m.position.normed, m.confident, m.score] for m in r.matches]))")
    res = _child(code, {"PYTHONPATH": str(ROOT)}, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    r = align(SAMPLES / "record_wrong_fix.pt", SAMPLES / "capture_sweep.safetensors")
    theirs = json.loads(res.stdout.strip().splitlines()[-1])
    assert [t[:3] for t in theirs] == [[m.position.p, m.position.normed, m.confident] for m in r.matches]
    assert np.allclose([t[3] for t in theirs], [m.score for m in r.matches], atol=1e-6)


def test_a_read_only_install_compiles_in_memory_without_error(tmp_path):
    """The package and every cache folder numba could use on a read-only mount: no error, no file written."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode:
        pytest.skip("needs a private mount namespace (unshare) for a read-only bind mount")
    ro = tmp_path / "ro"
    (ro / "home").mkdir(parents=True)
    shutil.copytree(ROOT / "eagleforensics", ro / "eagleforensics", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import numpy as np\nimport torch\nfrom eagleforensics.evidence import fused, norms\n"
            "x = torch.randn(8, 64).to(torch.bfloat16)\n"
            "assert np.allclose(norms.token_norms(x), torch.linalg.vector_norm(x.float(), dim=-1).numpy())\n"
            "print(type(fused.kernels().row_stats._cache).__name__)")
    script = tmp_path / "child.py"
    script.write_text(code)
    cmd = (f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} && ! touch {ro}/probe 2>/dev/null && "
           f"exec {sys.executable} -W error {script}")
    env = {**os.environ, "PYTHONPATH": str(ro), "HOME": str(ro / "home"), "XDG_CACHE_HOME": str(ro / "home"),
           "NUMBA_CACHE_DIR": str(ro / "cache"), "EAGLEFORENSICS_FUSED": "1"}
    res = subprocess.run(["unshare", "--mount", "sh", "-c", cmd], env=env, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[-1] == "NullCache"  # compiled in memory
    assert not [p for p in ro.rglob("*") if p.suffix in (".nbi", ".nbc")]


def _reference_steps(cap, cs, lw):
    """``identity.step_reader``'s step of every neighbouring pair of raw positions (reads the file)."""
    step_of = step_reader(cap.read_rows, cs, lw)
    raw = sorted(p.p for p in cap.positions if not p.normed)
    return {(p, p + 1): step_of(p, p + 1) for p in raw if p + 1 in raw}


def _assert_same_steps(got, want):
    assert got is not None and set(got) == set(want)
    for key, v in want.items():
        assert (np.isnan(v) and np.isnan(got[key])) or abs(got[key] - v) < 1e-6, (key, got[key], v)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_steps_from_the_sums_equal_step_reader_on_a_real_capture(tmp_path, monkeypatch, dtype):
    """The layer step kept in the one pass (adj) gives identity's medians without reading the file
    again: equal to ``step_reader`` within 1e-6, NaN/Inf rows left out, in and off the token window."""
    run = forward("qwen3")
    sweep = dict(run.sweep)
    sweep["hidden.3"] = sweep["hidden.3"].clone()
    sweep["hidden.3"][4] = float("nan")
    sweep["hidden.6"] = sweep["hidden.6"].clone()
    sweep["hidden.6"][9, 2] = float("inf")
    path = tmp_path / f"{dtype}.safetensors"
    write_capture(path, sweep, _model("qwen3", 0), dtype=dtype)
    cap = load_capture(path)
    for window in ((0, 0, 32), (3, 5, 20), (0, 31, 1)):
        got, _ = _both(monkeypatch, _slots(run, torch.bfloat16), cap, window, match.FIT_CANDIDATES)
        want = _reference_steps(cap, *window[1:])
        assert len(want) == N and np.isfinite(list(want.values())).all()
        _assert_same_steps(got.steps, want)


def test_steps_of_a_capture_in_one_file_per_position(tmp_path, monkeypatch):
    run = forward("llama")
    d = tmp_path / "dir"
    d.mkdir()
    for p in range(N + 1):
        save_file({"h": run.p(p).to(torch.float16).contiguous()}, str(d / f"layer_{p}.safetensors"))
    cap = load_capture(d, convention="vllm", num_layers=N)
    got, _ = _both(monkeypatch, _slots(run, torch.float32), cap, (2, 1, 30), None)
    _assert_same_steps(got.steps, _reference_steps(cap, 1, 30))


def test_align_answers_identity_from_the_kept_steps_without_reading_again(tmp_path, monkeypatch):
    """With the compiled scorer, identity's step comes from the sums: no row of the capture is
    read for it, and the identities equal those of the torch path (which reads the rows)."""
    from eagleforensics import alignment

    read = []
    real = alignment.step_reader
    monkeypatch.setattr(alignment, "step_reader", lambda *a, **k: (lambda p, q: read.append((p, q)) or
                                                                   real(*a, **k)(p, q)))
    got = align(SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture_sweep.safetensors")
    assert got.scores.steps and not read
    monkeypatch.setattr(fused, "AVAILABLE", False)
    ref = align(SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture_sweep.safetensors")
    assert read and ref.scores.steps is None
    assert [(m.position, m.confident, m.identity) for m in got.matches] == \
        [(m.position, m.confident, m.identity) for m in ref.matches]


def test_a_capture_cut_short_while_it_is_read_is_a_one_line_error(tmp_path, monkeypatch):
    """The kernels read with pread: a file truncated after it was checked gives a short read,
    reported as bad input naming the file (a memory map would have ended the process with SIGBUS)."""
    run = forward("llama")
    path = tmp_path / "cut.safetensors"
    write_capture(path, run.sweep, _model("llama", 0), dtype="bfloat16")
    cap = load_capture(path)
    real = fused.Stored.of

    def cut(rows, h):
        st = real(rows, h)
        os.truncate(path, path.stat().st_size // 2)
        return st

    monkeypatch.setattr(fused.Stored, "of", cut)
    with pytest.raises(ForensicsError, match="shorter than its header says") as err:
        match.score_slots(_slots(run, torch.bfloat16), [False] * 4, cap.positions, cap, 0, 0, 32)
    assert err.value.path == str(path)


@pytest.mark.parametrize("count", [1, 3, 5, 9])
def test_any_number_of_slots_gives_the_torch_path_scores(tmp_path, monkeypatch, count):
    """The direct pass meets slots four at a time (zero rows pad the last group): 1, 3, 5 and 9
    slots of a real sweep, mixed dtypes among them, score as on the torch path."""
    run = forward("llama")
    path = tmp_path / "cap.safetensors"
    write_capture(path, run.sweep, _model("llama", 0), dtype="bfloat16")
    cap = load_capture(path)
    slots = [run.p(1 + i % N).to(torch.bfloat16 if i % 3 else torch.float32).contiguous() for i in range(count)]
    calls = []
    kern = fused.kernels()
    real = kern.direct
    monkeypatch.setattr(kern, "direct", lambda *a: calls.append(1) or real(*a))
    got = match.score_slots(slots, [False] * count, cap.positions, cap, 2, 2, 28)
    assert calls
    monkeypatch.setattr(fused, "AVAILABLE", False)
    ref = match.score_slots(slots, [False] * count, cap.positions, cap, 2, 2, 28)
    assert _worst(got, ref)["score"] < 1e-6
    for i in range(count):  # each slot meets the position it was drawn from as itself
        assert got.score[i, got.columns.index(Position(1 + i % N))] > 0.999


def _counted(monkeypatch, names):
    """Count calls of the named kernels (each still runs)."""
    kern = fused.kernels()
    calls = {n: 0 for n in names}
    for n in names:
        real = getattr(kern, n)

        def wrap(*a, _n=n, _real=real):
            calls[_n] += 1
            return _real(*a)

        monkeypatch.setattr(kern, n, wrap)
    return calls


def test_fitted_columns_and_max_abs_come_from_the_one_pass_when_guessed(tmp_path, monkeypatch):
    """Issue 23: the gain equations of the fitted columns' positions and each slot's max |diff| are summed
    in the direct pass (one read fewer per fitted column, none for max |diff|); a wrong guess, or a guess
    from fewer tokens, only costs reads: every score, per-token value and max |diff| is the same, and
    the numpy path's within 1e-6. NaN rows on both sides, at the fitted positions too."""
    run = forward("llama")
    sweep = dict(run.sweep)
    for p, row in ((N - 1, 4), (N - 2, 11)):  # the final slot's candidate positions
        sweep[f"hidden.{p}"] = sweep[f"hidden.{p}"].clone()
        sweep[f"hidden.{p}"][row] = float("nan")
    path = tmp_path / "cap.safetensors"
    write_capture(path, sweep, _model("llama", 0), dtype="bfloat16")
    cap = load_capture(path)
    slots = _slots(run, torch.bfloat16)
    slots[3] = slots[3].clone()
    slots[3][20] = float("inf")
    fit = [False, False, False, True]
    window = (2, 2, 28)
    calls = _counted(monkeypatch, ["fit_equations", "max_abs"])
    columns: list[int] = []  # positions each fit_scores launch reads
    scores = fused.kernels().fit_scores
    monkeypatch.setattr(fused.kernels(), "fit_scores", lambda *a: columns.append(len(a[8])) or scores(*a))
    right = match.score_slots(slots, fit, cap.positions, cap, *window)
    assert calls == {"fit_equations": 0, "max_abs": 0}, calls
    assert columns == [match.FIT_CANDIDATES], columns  # one launch scores every fitted column of the slot

    def wrong(m, sums, slots_, ts, below, fc):  # guesses nothing the answer needs
        return fused.Plan([sums.virt[0]], list(sums.fit_idx), [0] * sums.k, sums.k, sums.lw)

    monkeypatch.setattr(match, "_preview", wrong)
    calls.update({n: 0 for n in calls})
    guessed_wrong = match.score_slots(slots, fit, cap.positions, cap, *window)
    assert calls["fit_equations"] == match.FIT_CANDIDATES and calls["max_abs"] == 4, calls
    monkeypatch.undo()
    monkeypatch.setattr(fused, "MIN_BYTES", 0)
    monkeypatch.setattr(fused, "_MODE", "1")
    monkeypatch.setattr(match, "PREVIEW_TOKENS", 3)  # a guess from 3 of 26 tokens
    few = match.score_slots(slots, fit, cap.positions, cap, *window)
    monkeypatch.setattr(fused, "AVAILABLE", False)
    ref = match.score_slots(slots, fit, cap.positions, cap, *window)
    for other in (guessed_wrong, few):
        for name in FIELDS:
            np.testing.assert_allclose(getattr(other, name), getattr(right, name), rtol=0, atol=1e-9, err_msg=name)
    worst = _worst(right, ref)
    assert worst["score"] < 1e-6 and worst["max_abs"] < 1e-5, worst
    assert np.isfinite(right.max_abs).sum() == 4  # each slot's best column


def test_a_capture_file_swapped_for_a_fifo_is_left_to_the_guarded_reader(tmp_path):
    """The kernels open the capture's files themselves; a file replaced by a FIFO after the loader read its
    header (os.open blocked for ever on a FIFO with no writer) is refused on the descriptor, so the kernels
    step aside and the loader's own guarded reader names the file."""
    import threading

    from eagleforensics.io.filerows import FileRows

    path = tmp_path / "rows.bin"
    np.zeros((8, 16), np.float32).tofile(path)
    rows = [FileRows(path, 0, 8, 16, np.dtype(np.float32))]
    assert fused.Stored.of(rows, 16) is not None  # a regular file: the kernels take it
    path.unlink()
    os.mkfifo(path)
    out = []
    worker = threading.Thread(target=lambda: out.append(fused.Stored.of(rows, 16)), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # the old code: open(2) waits for a writer; unblock it, then fail
        with open(path, "wb"):
            pass
        pytest.fail("Stored.of blocked on a FIFO")
    assert out == [None]
    with pytest.raises(ForensicsError, match="not a regular file"):
        rows[0].read(0, 1)


KERNEL_NAMES = ("row_stats", "direct", "fit_scores")
_SIGNATURES = ("import json\nfrom eagleforensics.evidence import fused\n"
               "def signatures():\n"
               f"    return {{n: [str(s) for s in getattr(fused._KERNELS, n).signatures] for n in {KERNEL_NAMES!r}}}\n")


def test_the_kernels_load_ahead_with_the_argument_types_the_scorer_passes(tmp_path):
    """``fused.preload`` loads each kernel for the exact argument types a real align passes: a real
    run in another process (kernels forced) ends with the same single signature per kernel, on a
    SpecForge record (column slices of aux_hidden_state) and on a record of whole arrays."""
    env = {"PYTHONPATH": str(ROOT), "EAGLEFORENSICS_FUSED": "1"}
    warm = _child(_SIGNATURES + "t = fused.preload(1)\nassert t is not None\nt.join()\nprint(json.dumps(signatures()))",
                  env, tmp_path)
    assert warm.returncode == 0, warm.stderr[-2000:]
    ahead = json.loads(warm.stdout.strip().splitlines()[-1])
    assert all(len(ahead[n]) == 1 for n in KERNEL_NAMES), ahead
    for record, capture in (("data_0.ckpt", "capture.pt"), ("record_layer_outputs.safetensors",
                                                             "capture_sweep.safetensors")):
        code = (_SIGNATURES + "from eagleforensics.alignment import align\nfused.preload = lambda n: None\n"
                f"align({str(SAMPLES / record)!r}, {str(SAMPLES / capture)!r})\nprint(json.dumps(signatures()))")
        real = _child(code, env, tmp_path)
        assert real.returncode == 0, real.stderr[-2000:]
        used = json.loads(real.stdout.strip().splitlines()[-1])
        assert used == ahead, (record, used, ahead)  # every kernel ran (one signature each), as loaded ahead


def test_a_small_align_loads_no_kernels_and_a_large_one_starts_loading_them(tmp_path):
    """Below ``MIN_BYTES`` of input nothing is loaded ahead (numba's import alone would cost the samples
    their start-up target); from it on, ``preload`` starts one daemon thread, once per process. In a
    command (the CLI marks its process short-lived) numba's objects are then frozen out of the cyclic
    collector's sight; in a host process (a notebook) nothing is frozen and the collector runs as before."""
    cli = ("import gc, sys, threading\nfrom eagleforensics.cli import run\nfrom eagleforensics.evidence import fused\n"
           f"sys.argv = ['eagleforensics', 'align', {str(SAMPLES / 'record_layer_outputs.safetensors')!r}, "
           f"{str(SAMPLES / 'capture_sweep.safetensors')!r}, '--json']\n"
           "try:\n    run()\nexcept SystemExit:\n    pass\n"
           "assert 'numba' not in sys.modules, 'a small align imported numba'\n"
           "assert threading.active_count() == 1\n"
           "assert fused.preload(fused.MIN_BYTES - 1) is None\n"
           "t = fused.preload(fused.MIN_BYTES)\nassert t is not None and t.daemon\nt.join()\n"
           "assert fused.preload(fused.MIN_BYTES) is None  # loaded: nothing more to start\n"
           "assert gc.get_freeze_count() > 10_000 and gc.isenabled(), gc.get_freeze_count()\nprint('ok')")
    host = ("import gc\nfrom eagleforensics.evidence import fused\n"
            "t = fused.preload(fused.MIN_BYTES)\nassert t is not None\nt.join()\n"
            "assert gc.get_freeze_count() == 0 and gc.isenabled()\nprint('ok')")
    for code in (cli, host):  # this machine's cache marked as holding the kernels (``kernelcache``)
        res = _child(MARKED + code, {"PYTHONPATH": str(ROOT), "EAGLEFORENSICS_KERNEL_DIR": str(tmp_path)}, tmp_path,
                     drop=("EAGLEFORENSICS_FUSED",))
        assert res.returncode == 0 and res.stdout.split()[-1] == "ok", res.stderr[-2000:]


def test_a_command_freezes_numbas_objects_before_the_collector_comes_back(tmp_path):
    """The loader freezes while the collector is still paused: were it re-enabled first, the main thread's
    next allocation could start a full collection over every object numba left (40-80 ms of a T=512 align)."""
    code = ("import gc\nfrom eagleforensics import process\nprocess.mark_short_lived()\n"
            "from eagleforensics.evidence import fused\nseen = []\nreal = gc.freeze\n"
            "gc.freeze = lambda: (seen.append(gc.isenabled()), real())\n"
            "t = fused.preload(fused.MIN_BYTES)\nt.join()\n"
            "assert seen == [False], seen\nassert gc.isenabled() and gc.get_freeze_count() > 10_000\nprint('ok')")
    res = _child(MARKED + code, {"PYTHONPATH": str(ROOT), "EAGLEFORENSICS_KERNEL_DIR": str(tmp_path)}, tmp_path,
                 drop=("EAGLEFORENSICS_FUSED",))
    assert res.returncode == 0 and res.stdout.split()[-1] == "ok", res.stderr[-2000:]


def test_the_collector_pause_restores_whatever_state_it_found():
    import gc

    was = gc.isenabled()
    try:
        for state in (True, False):
            (gc.enable if state else gc.disable)()
            with fused._collector_paused():
                assert not gc.isenabled()
            assert gc.isenabled() is state
    finally:
        (gc.enable if was else gc.disable)()


class _Loader:
    """A stand-in for preload's thread that records whether align joined it."""

    def __init__(self) -> None:
        self.joined = 0

    def join(self) -> None:
        self.joined += 1


def test_align_joins_the_loader_on_success_and_on_bad_input(tmp_path, monkeypatch):
    """align joins the loader it started, whether it returns or raises (a thread left running would
    race the next call's kernel counts in a notebook or a test)."""
    from eagleforensics import alignment

    loaders: list[_Loader] = []
    monkeypatch.setattr(alignment, "preload", lambda nbytes: loaders.append(_Loader()) or loaders[-1])
    align(SAMPLES / "record_layer_outputs.safetensors", SAMPLES / "capture_sweep.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(ForensicsError):
        align(bad, SAMPLES / "capture_sweep.safetensors")
    assert [t.joined for t in loaders] == [1, 1]


def test_ctrl_c_in_align_does_not_wait_for_the_loader(monkeypatch):
    """Ctrl-C (or SIGTERM, ``interrupts.Terminated``) leaves at once: the loader, a daemon, is not joined."""
    from eagleforensics import alignment
    from eagleforensics.interrupts import Terminated

    for signal_exc in (KeyboardInterrupt, Terminated):
        loader = _Loader()
        monkeypatch.setattr(alignment, "preload", lambda nbytes, t=loader: t)

        def interrupted(*args, exc=signal_exc):
            raise exc

        monkeypatch.setattr(alignment, "_align", interrupted)
        with pytest.raises(signal_exc):
            align(SAMPLES / "record_layer_outputs.safetensors", SAMPLES / "capture_sweep.safetensors")
        assert loader.joined == 0


def test_main_called_in_process_leaves_its_host_process_long_lived():
    """A notebook or a test that calls the CLI's ``main`` in-process must not get the command's GC policy
    (``cli.run``, the program, sets it: see the child processes above)."""
    from click.testing import CliRunner

    from eagleforensics import process
    from eagleforensics.cli import main

    res = CliRunner().invoke(main, ["align", str(SAMPLES / "record_layer_outputs.safetensors"),
                                    str(SAMPLES / "capture_sweep.safetensors"), "--json"])
    assert res.exit_code in (0, 1), res.output[-2000:]
    assert process.SHORT_LIVED is False


def test_a_command_stops_numpy_asking_for_huge_pages_unless_the_user_chose(tmp_path):
    """``cli.run`` turns numpy's huge-page advice off (a fresh 117 MB record's huge pages now and then took 0.2 s),
    whether numpy is imported before the command starts or after; it also tells child processes through
    the environment. A user's own ``NUMPY_MADVISE_HUGEPAGE`` is left as it is, and a host process that
    calls ``main`` in-process (above) keeps numpy's setting."""
    def probe(before: bool, preset: str | None, command: bool = True) -> tuple[bool, str]:
        """(numpy's advice after the start, the variable's value) in a fresh process; without
        ``command`` the CLI is only imported, as a host process would."""
        imp = "import numpy\n" if before else ""
        start = "from eagleforensics import process\nprocess.mark_short_lived()\n" if command else \
            "import eagleforensics.cli\n"
        code = (f"import os\n{imp}{start}from numpy._core import multiarray\n"
                "print(bool(multiarray._set_madvise_hugepage(True)), os.environ.get('NUMPY_MADVISE_HUGEPAGE'))")
        env = {"PYTHONPATH": str(ROOT)} | ({} if preset is None else {"NUMPY_MADVISE_HUGEPAGE": preset})
        res = _child(code, env, tmp_path, drop=("NUMPY_MADVISE_HUGEPAGE",), timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        on, val = res.stdout.split()
        return on == "True", val

    assert probe(before=True, preset=None) == (False, "0")
    assert probe(before=False, preset=None) == (False, "0")
    assert probe(before=True, preset="1") == (True, "1")
    assert probe(before=False, preset="1") == (True, "1")
    # importing the CLI changes nothing: numpy's own default (on, from Linux 4.6) stands
    assert probe(before=True, preset=None, command=False) == (True, "None")
