"""The real pair's held-out set (``data_samples/real``) holds together without loading a model: 64 sequences of the
prompts the drafter never saw, figures.json's pooled acc_k equal to its per-sequence counts, the run's own figures
kept beside them (``scripts/make_real_samples.py --extend-heldout``)."""
from __future__ import annotations

import json
from pathlib import Path

from eagleforensics.testing import realsamples

REAL = Path(__file__).resolve().parent.parent / "data_samples" / "real"
WIRINGS = ("trained", "shallower", "deeper", "wrong_fix")


def _pooled(rows: list[dict], name: str) -> list[float]:
    return [round(sum(r["trainer"][name][k][0] for r in rows) / sum(r["trainer"][name][k][1] for r in rows), 4)
            for k in range(3)]


def test_the_held_out_prompts_are_the_seeded_orders_tail_and_none_was_trained_on() -> None:
    """prompts(n) is one shuffle cut at n: the training prompts (the first train_prompts) are the same for any n,
    and the held-out sequences are the next ones, in order, each opening with its prompt's chat rendering."""
    held = realsamples.read_heldout(REAL / "heldout.jsonl")
    fig = json.loads((REAL / "figures.json").read_text())
    n_train = fig["train_prompts"]
    assert len(held) == fig["heldout"] == 64 and fig["prompts"] == n_train + 64
    every = realsamples.prompts(fig["prompts"])
    assert every[:n_train] == realsamples.prompts(n_train) == realsamples.prompts(96)[:n_train]
    assert [h["prompt"] for h in held] == every[n_train:]
    assert not set(every[:n_train]) & {h["prompt"] for h in held}
    for h in held:
        assert 0 < h["prompt_tokens"] < len(h["input_ids"]) <= h["prompt_tokens"] + fig["max_new"]
        counted = len(h["input_ids"]) - h["prompt_tokens"]
        for name in WIRINGS:  # every step counts the rows whose next token is an answer token (the last has none)
            assert [c for _, c in h["trainer"][name]] == [counted - 1] * 3, (h["prompt"], name)


def test_figures_pool_the_per_sequence_counts_and_keep_the_runs_own() -> None:
    held = realsamples.read_heldout(REAL / "heldout.jsonl")
    fig = json.loads((REAL / "figures.json").read_text())
    run = fig["heldout_acc_run"]
    for name in WIRINGS:
        assert fig["heldout_acc"][name] == _pooled(held, name)
        assert run["heldout_acc"][name] == _pooled(held[:run["heldout"]], name)
        assert fig["extended"]["heldout_acc_new"][name] == _pooled(held[run["heldout"]:], name)
    assert all(h.get("weights") == "stored-bf16" for h in held[run["heldout"]:])
    assert not any("weights" in h for h in held[:run["heldout"]])


def test_the_readmes_doctor_example_is_what_real_example_writes() -> None:
    """The README's doctor command names the files scripts/real_example.py writes (its target the directory the
    realtarget module prints), and the launch planted is the incident's: ids one layer deeper than trained."""
    import shlex
    import sys

    sys.path.insert(0, str(REAL.parent.parent / "scripts"))
    try:
        import real_example
    finally:
        sys.path.pop(0)
    readme = (REAL.parent.parent / "README.md").read_text()
    assert ".venv/bin/python scripts/real_example.py reports/real" in readme
    line = next(x for x in readme.splitlines() if x.startswith("$ eagleforensics doctor"))
    target = '"$(.venv/bin/python -m eagleforensics.testing.realtarget)"'
    assert target in line
    want = real_example.inputs(Path("reports/real"), "TARGET")
    got = shlex.split(line[2:].replace(target, "TARGET"))[2:]
    assert got == [x for k, v in want.items() for x in (f"--{k}", v)]
    trained = json.loads((REAL / "drafter" / "config.json").read_text())["eagle_config"]
    assert real_example.PLANTED_IDS == [i + 1 for i in trained["eagle_aux_hidden_state_layer_ids"]]
