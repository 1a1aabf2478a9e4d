"""Snapshot ``align``'s answers on every sample and a grid of real test records, and compare two snapshots.

Use it around a change that must not move any answer (a faster reader, a faster scorer):

    python scripts/align_snapshot.py fixtures /tmp/snapfix          # write the test records once (torch)
    python scripts/align_snapshot.py run /tmp/snapfix /tmp/before    # before the change
    python scripts/align_snapshot.py run /tmp/snapfix /tmp/after     # after it
    python scripts/align_snapshot.py compare /tmp/before /tmp/after  # JSON equal, scores within 1e-6

``fixtures`` writes real forward passes of the tiny Llama / Qwen3 / DeepSeek-V3 models (``testing.tinymodels``)
as every record layout (list ``.pt``, SpecForge ``.ckpt`` and ``.ckpt.gz``, speculators, ModelOpt,
EAGLE, generic, a legacy non-zip ``.pt``) and every capture kind (HF tuple ``.pt``, the capture
helper's safetensors in bf16 / fp16 / fp32, a directory of per-position ``.pt`` files), including
a NaN row and a wrong wiring. ``run`` aligns each record with each capture of its model, on the
numpy path and with the compiled kernels forced (one child process each), and keeps the JSON and
the score matrices. ``compare`` says which cases differ: every JSON value that is not a float must
be equal, floats and score cells within 1e-6 (NaN where NaN).
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data_samples"
TOL = 1e-6
FIELDS = ("score", "rel_diff", "max_abs", "norm_ratio", "per_token", "tokens_used")


def fixtures(out: Path) -> None:
    """Write records and captures of three tiny models into ``out`` (torch and transformers needed)."""
    import torch

    from eagleforensics.io.sweep import sweep, write_capture
    from eagleforensics.testing.tinymodels import build_model, prompt_ids

    out.mkdir(parents=True, exist_ok=True)
    n = 8
    for family, length in (("llama", 48), ("qwen3", 40), ("deepseek_v3", 36)):
        model = build_model(family, num_layers=n, hidden=64, seed=3)
        ids = prompt_ids(length, seed=5)
        with torch.no_grad():
            hs = [h[0] for h in model(ids[None], output_hidden_states=True).hidden_states]
        sw = sweep(model, ids)
        d = out / family
        (d / "dir").mkdir(parents=True, exist_ok=True)
        torch.save({"hidden_states": [h[None].contiguous() for h in hs], "input_ids": ids.clone()}, d / "cap_hf.pt")
        for dt in ("bfloat16", "float16", "float32"):
            write_capture(d / f"cap_{dt}.safetensors", sw, model, dtype=dt)
        for p in range(n + 1):
            torch.save(sw[f"hidden.{p}"].clone(), d / "dir" / f"layer_{p}.pt")
        torch.save(ids.clone(), d / "dir" / "input_ids.pt")

        def bf(p: int) -> torch.Tensor:
            return sw[f"hidden.{p}"].to(torch.bfloat16).contiguous()

        final = hs[n].to(torch.bfloat16).contiguous()
        mask = torch.ones(length, dtype=torch.int64)
        aux = torch.cat([bf(3), bf(5), bf(7)], dim=-1)
        torch.save({"hidden_states": [bf(3), bf(5), bf(7), final], "input_ids": ids.clone()}, d / "rec_list.pt")
        torch.save({"hidden_states": [bf(0), bf(2), bf(4), final], "input_ids": ids.clone()}, d / "rec_wrong.pt")
        nan = bf(5).clone()
        nan[4] = float("nan")
        torch.save({"hidden_states": [bf(3), nan, bf(7), final], "input_ids": ids.clone()}, d / "rec_nan.pt")
        ckpt = {"input_ids": ids.clone(), "loss_mask": mask.clone(), "hidden_state": final[None].clone(),
                "aux_hidden_state": aux[None].clone()}
        torch.save(ckpt, d / "rec_specforge.ckpt")
        with gzip.open(d / "rec_specforge.ckpt.gz", "wb") as fh:
            torch.save(ckpt, fh)
        torch.save(ckpt, d / "rec_legacy.pt", _use_new_zipfile_serialization=False)
        torch.save({"token_ids": ids.clone(), "hidden_states": torch.stack([bf(2), bf(4), bf(6), final], 1)},
                   d / "rec_speculators.pt")
        torch.save({"input_ids": ids.clone(), "hidden_states": final.float().clone(),
                    "aux_hidden_states": aux.float().clone(), "conversation_id": 7}, d / "rec_modelopt.pt")
        torch.save({"input_ids": ids.clone(), "hidden_state": final.half().clone(), "loss_mask": mask.clone()},
                   d / "rec_eagle.pt")
        torch.save({"a": bf(1), "b": sw[f"hidden.{n}"].clone(), "step": 3}, d / "rec_generic.pt")


def cases(fix: Path) -> list[tuple[str, str, str]]:
    """(name, record, capture) of every pair to align: the samples, and each fixture record with each capture."""
    out = []
    for rec in ("record_layer_outputs.pt", "record_layer_outputs.safetensors", "record_wrong_fix.pt", "data_0.ckpt"):
        for cap in ("capture.pt", "capture_sweep.safetensors"):
            out.append((f"sample-{rec}-{cap}", str(SAMPLES / rec), str(SAMPLES / cap)))
    for d in sorted(p for p in fix.iterdir() if p.is_dir()):
        caps = sorted(c.name for c in d.glob("cap_*")) + ["dir"]
        for rec in sorted(r.name for r in d.glob("rec_*")):
            for cap in caps:
                out.append((f"{d.name}-{rec}-{cap}", str(d / rec), str(d / cap)))
    return out


def run(fix: Path, out: Path) -> None:
    """Align every case on the numpy path and with the kernels forced, each in a child process."""
    out.mkdir(parents=True, exist_ok=True)
    for mode in ("0", "1"):
        env = {**os.environ, "EAGLEFORENSICS_FUSED": mode}
        subprocess.run([sys.executable, __file__, "_child", str(fix), str(out / f"fused{mode}")], env=env, check=True)


def _child(fix: Path, out: Path) -> None:
    import numpy as np

    from eagleforensics.alignment import align
    from eagleforensics.errors import ForensicsError

    out.mkdir(parents=True, exist_ok=True)
    for name, rec, cap in cases(fix):
        try:
            res = align(rec, cap)
        except ForensicsError as exc:
            (out / f"{name}.json").write_text(json.dumps({"error": str(exc)}))
            continue
        (out / f"{name}.json").write_text(res.to_json())
        sm = res.scores
        np.savez(out / f"{name}.npz", columns=np.array([c.label for c in sm.columns]),
                 **{f: np.asarray(getattr(sm, f)) for f in FIELDS})
    print(f"{out}: {len(cases(fix))} cases")


def _close(a: Any, b: Any, where: str, bad: list[str]) -> None:
    if isinstance(a, float) and isinstance(b, (float, int)) or isinstance(b, float) and isinstance(a, int):
        if not (a == b or (a != a and b != b) or abs(a - b) <= TOL):
            bad.append(f"{where}: {a!r} != {b!r}")
    elif isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            bad.append(f"{where}: keys {list(a)} != {list(b)}")
        for k in a:
            if k in b:
                _close(a[k], b[k], f"{where}.{k}", bad)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            bad.append(f"{where}: {len(a)} items != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]", bad)
    elif a != b:
        bad.append(f"{where}: {str(a)[:200]!r} != {str(b)[:200]!r}")


def compare(a: Path, b: Path) -> int:
    """Print every difference between two ``run`` outputs; exit 1 if any."""
    import numpy as np

    differing = identical = 0
    for mode in sorted(p.name for p in a.iterdir() if p.is_dir()):
        for ja in sorted((a / mode).glob("*.json")):
            jb = b / mode / ja.name
            bad: list[str] = []
            if not jb.exists():
                bad.append("missing")
            else:
                ta, tb = ja.read_text(), jb.read_text()
                identical += ta == tb
                _close(json.loads(ta), json.loads(tb), "json", bad)
                na, nb = ja.with_suffix(".npz"), jb.with_suffix(".npz")
                if na.exists() != nb.exists():
                    bad.append("score matrix on one side only")
                elif na.exists():
                    with np.load(na) as x, np.load(nb) as y:
                        if list(x["columns"]) != list(y["columns"]):
                            bad.append("columns differ")
                        for f in FIELDS:
                            u, v = x[f], y[f]
                            if u.shape != v.shape or not np.array_equal(np.isnan(u), np.isnan(v)):
                                bad.append(f"{f}: shape or NaN pattern differs")
                            elif np.isfinite(u).any() and float(np.nanmax(np.abs(u - v))) > TOL:
                                bad.append(f"{f}: max |diff| {float(np.nanmax(np.abs(u - v))):.2e}")
            if bad:
                differing += 1
                print(f"{mode}/{ja.stem}: " + "; ".join(bad[:6]))
    total = sum(1 for _ in a.glob("*/*.json"))
    print(f"{total} cases: {differing} differ beyond {TOL}, {identical} JSON byte-identical")
    return 1 if differing else 0


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "fixtures":
        fixtures(Path(args[0]))
    elif cmd == "run":
        run(Path(args[0]), Path(args[1]))
    elif cmd == "_child":
        _child(Path(args[0]), Path(args[1]))
    elif cmd == "compare":
        sys.exit(compare(Path(args[0]), Path(args[1])))
    else:
        raise SystemExit(__doc__)
