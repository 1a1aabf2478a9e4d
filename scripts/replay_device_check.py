"""Replay on CUDA against replay on CPU, on the SpecForge fixture: same counted rows, same figures (one-off check).

    python scripts/replay_device_check.py [--device cuda]

Near-tie argmaxes may flip between devices (float32 kernels differ), so figures can differ by a row or two.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eagleforensics.replay import run_replay  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "specforge"


def main() -> None:
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    worst = 0.0
    for i in range(6):
        args = dict(target=FIX / "target", train=FIX / f"heldout_{i}.ckpt", wirings=["p0,p2,p4"], steps=7,
                    temperature=0.7, topk=3, draft_tokens=10)
        cpu = run_replay(FIX / "drafter", FIX / f"heldout_{i}.safetensors", device="cpu", **args).to_dict()
        gpu = run_replay(FIX / "drafter", FIX / f"heldout_{i}.safetensors", device=device, **args).to_dict()
        for a, b in zip(cpu["wirings"], gpu["wirings"]):
            assert a["acc_rows"] == b["acc_rows"], (i, a["label"])
            pairs = list(zip(a["acc"], b["acc"])) + [(a["accept_length"], b["accept_length"]),
                                                     (a["tree"]["accept_length"], b["tree"]["accept_length"]),
                                                     (a["sampling"]["sampled_drafts"]["accept_length"],
                                                      b["sampling"]["sampled_drafts"]["accept_length"])]
            worst = max(worst, max(abs(x - y) for x, y in pairs))
    print(f"{device} vs cpu on 6 records x 3 wirings: max |diff| of acc@k, accept length, tree, sampling = {worst:.2e}")


if __name__ == "__main__":
    main()
