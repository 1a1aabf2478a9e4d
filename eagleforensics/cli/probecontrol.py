"""``probe --control --drafter DIR``: replay the drafter on the very records probe sends, as the control's expectation.

probe (a pipeline) may not import replay; the CLI composes them: each record is replayed on its
own aux states (the trained wiring, ``replay.run_replay`` with the record as the capture), the
trained rows are merged (reach at each step weighted by the rows each record scored) and written as
one replay JSON that probe reads like any other.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import ForensicsError

CONTROL_STEPS = 8  # replayed steps: enough for any chain a server runs (SGLang's adaptive candidates go to 7)


def _has_weights(target: str | None) -> bool:
    return target is not None and Path(target).is_dir() and any(Path(target).glob("*.safetensors*"))


def control_replay(drafter: str, records: list[Path], target: str | None, out: Path) -> Path:
    """Replay ``drafter`` on each record (its trained wiring), merge the trained rows, write them to ``out``."""
    from ..replay import run_replay

    base = None
    rows = []
    for rec in records:
        doc = json.loads(run_replay(drafter, rec, target=target if _has_weights(target) else None,
                                    steps=CONTROL_STEPS).to_json())
        trained = next((w for w in doc.get("wirings", []) if w.get("label") == doc.get("trained")), None)
        if trained is None:
            raise ForensicsError("replay found no trained wiring in this record (a training record in a trainer's "
                                 "own layout is needed for --control --drafter)", path=rec)
        base = base or doc
        rows.append(trained)
    if base is None:
        raise ForensicsError("--control --drafter needs --train RECORDS")
    width = min(len(w["reach"]) for w in rows)
    total = sum(int(w.get("starts") or 0) for w in rows)
    if total <= 0:
        raise ForensicsError("replay scored no rows on the records (no supervised tokens?)")
    reach = []
    for j in range(width):
        vals = [(w["reach"][j], int(w.get("starts") or 0)) for w in rows if w["reach"][j] is not None]
        if not vals:
            break
        reach.append(sum(v * n for v, n in vals) / sum(n for _, n in vals))
    merged = {**rows[0], "reach": reach, "starts": total, "steps": len(reach),
              "accept_length": 1.0 + sum(reach), "source": "trained"}
    for key in ("acc", "cond", "sampling", "tree"):
        merged.pop(key, None)
    base.update({"wirings": [merged], "steps": len(reach),
                 "capture": f"{len(records)} record(s) probe sends: " + ", ".join(r.name for r in records[:4])})
    out.write_text(json.dumps(base))
    return out
