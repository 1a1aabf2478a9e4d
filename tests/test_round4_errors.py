"""Issue 31, round four: inputs that gave a traceback, nan or a wrong write now end as one stderr line, exit 2.

Each is run as a real process (``run_process``: exit code, stderr, peak memory), on the real fixtures.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from .test_errors import run_cli
from .test_hardening import run_process

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "specforge"


def one_line(code: int, out: str, err: str, *expect: str) -> None:
    assert code == 2 and out == "", (code, out[-500:], err[-1500:])
    assert err.count("\n") == 1 and err.startswith("eagleforensics: error: ") and "Traceback" not in err, err
    for e in expect:
        assert e in err, (e, err)


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_a_temperature_no_engine_samples_at_is_one_line(json_flag: list[str], tmp_path: Path) -> None:
    """--temperature 1e-45 printed nan (a traceback with --json): logits / 1e-45 overflow. Engines do not sample
    there either (vLLM raises it to 0.01, SGLang goes greedy below 1e-6): one line saying so."""
    args = ["replay", FIX / "drafter", FIX / "heldout_3.safetensors", "--target", FIX / "target", "--train",
            FIX / "heldout_3.ckpt", "--steps", "2", "--temperature", "1e-45", *json_flag]
    code, out, err, _ = run_process(args, tmp_path, timeout=120)
    one_line(code, out, err, "--temperature 1e-45", "pass 0 for greedy")


# ---------------------------------------------------------------------- writing: space, resume, outputs

SAMPLES = ROOT / "data_samples"
INCIDENT = SAMPLES / "incident"


def _in_a_full_tmpdir(tmp_path: Path, args: list[str]) -> tuple[int, str, str]:
    """Run the CLI with TMPDIR on a 64 KiB tmpfs left with 8 KiB free (a private mount namespace: ``unshare``),
    enough for Python's probe of TMPDIR to pass and not for the report's work notebook."""
    import shlex
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to mount a small tmpfs")
    full = tmp_path / "full"
    full.mkdir()
    cli = " ".join(shlex.quote(str(a)) for a in [sys.executable, "-m", "eagleforensics", *args])
    script = (f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(full))} || exit 99; "
              f"dd if=/dev/zero of={shlex.quote(str(full / 'fill'))} bs=4k count=14 2>/dev/null; "
              f"TMPDIR={shlex.quote(str(full))} exec {cli}")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode == 99:
        pytest.skip("cannot mount a tmpfs in a private namespace here")
    return proc.returncode, proc.stdout, proc.stderr


def test_a_full_tmpdir_under_report_is_one_line(tmp_path: Path) -> None:
    """The report's work folder is in TMPDIR: ENOSPC there was an internal error (exit 3); now one line, exit 2."""
    code, out, err = _in_a_full_tmpdir(tmp_path, ["plan", INCIDENT / "baseline.log", INCIDENT / "tuned.log",
                                                  "--report", tmp_path / "out.html"])
    assert code == 2 and "Traceback" not in err, (code, err[-1500:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eagleforensics: error: "), err
    assert "no space left on the device" in err and "TMPDIR" in err
    assert not (tmp_path / "out.html").exists()


def _scan_results(tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "data"
    data.mkdir()
    (data / "data_0.ckpt").write_bytes((SAMPLES / "data_0.ckpt").read_bytes())
    out = tmp_path / "r.jsonl"
    code, _, err, _ = run_process(["scan", data, "-o", out, "--workers", "1"], tmp_path, timeout=120)
    assert code in (0, 1), err
    return data, out


RESUME_LINES = {
    "a-list": "[1, 2, 3]",
    "no-path": '{"x": 1}',
    "path-not-text": '{"path": 5}',
    "slots-not-objects": '{"path": "a", "slots": "zzz"}',
    "slot-field-of-another-type": '{"path": "a", "slots": [{"name": "s", "log_norm": "high"}]}',
    "prefix-not-an-object": '{"path": "a", "slots": [{"name": "s", "prefix": [1]}]}',
}


def test_scan_resume_on_malformed_result_lines_is_one_line_naming_the_line(tmp_path: Path) -> None:
    """Lines that were skipped in silence (a list, no path) or crashed the judgement (AttributeError) are named."""
    data, out = _scan_results(tmp_path)
    good = out.read_text().splitlines()
    for i, (case, bad) in enumerate(RESUME_LINES.items()):
        out.write_text("\n".join([good[0], bad, *good[1:]]) + "\n")
        args = ["scan", data, "-o", out, "--resume", "--workers", "1"]
        code, stdout, err = run_process(args, tmp_path, 120)[:3] if i == 0 else run_cli(*map(str, args))
        assert code == 2, (case, err)
        one_line(code, stdout, err, "r.jsonl: line 2 is not a scan record")


def test_no_command_writes_inside_an_input_directory(tmp_path: Path) -> None:
    """scan -o TARGET/x.jsonl (or through a symlink to TARGET) wrote into the --target directory: the guard every
    writer shares (io.guards.check_not_input, fed every path the command was given) refuses it."""
    import shutil

    data, _ = _scan_results(tmp_path)
    target = tmp_path / "target"
    shutil.copytree(SAMPLES / "target", target)
    (tmp_path / "link").symlink_to(target)
    before = sorted(p.name for p in target.iterdir())
    code, stdout, err, _ = run_process(["scan", data, "--target", target, "-o", target / "x.jsonl", "--workers",
                                        "1"], tmp_path, 120)
    one_line(code, stdout, err, "inside the input --target")
    one_line(*run_cli("scan", str(data), "--target", str(target), "-o", str(tmp_path / "link" / "y.jsonl")),
             "inside the input --target")
    one_line(*run_cli("doctor", "--train", str(data), "--target", str(target), "--report",
                      str(tmp_path / "link" / "r.html")), "inside")
    assert sorted(p.name for p in target.iterdir()) == before


def test_command_inputs_are_every_path_a_command_was_given(tmp_path: Path) -> None:
    """The declared inputs come from the command's own parameters: LABEL=PATH by its path, outputs left out."""
    import click

    from eagleforensics.cli.common import command_inputs

    log = tmp_path / "a.log"
    log.write_text("x")

    @click.command()
    @click.argument("runs", nargs=-1)
    @click.option("--target", type=click.Path())
    @click.option("-o", "--output", type=click.Path())
    @click.option("--title")
    def cmd(runs, target, output, title):  # type: ignore[no-untyped-def]
        click.echo(repr(sorted(p for p, _ in command_inputs())))

    from click.testing import CliRunner

    res = CliRunner().invoke(cmd, [f"lab={log}", str(tmp_path), "--target", str(tmp_path), "-o", str(log),
                                   "--title", str(tmp_path / "a.log")])  # a title is text, even naming a file
    assert res.output.strip() == repr(sorted([str(log), str(tmp_path), str(tmp_path)]))


# ---------------------------------------------------------------------- notebook runs end

def test_a_hanging_notebook_cell_is_stopped_with_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    """Every notebook run has a per-cell timeout (EAGLEFORENSICS_CELL_TIMEOUT): a cell that never returns (the
    20-minute hang of test_explore_notebook_runs_headless) ends as NotebookFailed naming the limit."""
    import time

    import nbformat

    from eagleforensics.report import pipeline

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("import time\ntime.sleep(600)")]
    src = tmp_path / "hang.ipynb"
    nbformat.write(nb, str(src))
    monkeypatch.setenv(pipeline.CELL_TIMEOUT_ENV, "3")
    start = time.monotonic()
    with pytest.raises(pipeline.NotebookFailed, match="a cell ran longer than 3 s"):
        pipeline.execute(src, tmp_path / "out.ipynb", {}, cwd=tmp_path)
    assert time.monotonic() - start < 300  # stopped, not waited out (the cell sleeps 600 s)
    monkeypatch.setenv(pipeline.CELL_TIMEOUT_ENV, "soon")
    with pytest.raises(Exception, match="not a number of seconds"):
        pipeline.cell_timeout()


def test_the_suite_has_a_per_test_timeout() -> None:
    """pytest-timeout is installed with the test extra and configured: no test can hang the suite."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert any(d.startswith("pytest-timeout") for d in cfg["project"]["optional-dependencies"]["test"])
    assert 60 <= int(cfg["tool"]["pytest"]["ini_options"]["timeout"]) <= 600
    pytest.importorskip("pytest_timeout")


# ---------------------------------------------------------------------- data audit: no evidence is not "clean"

def test_all_zero_final_states_cannot_tell_who_wrote_the_answers(tmp_path: Path) -> None:
    """All-zero final states with random ids read "clean, agreement 100%", verdict from-target (every token tied
    for first under flat logits). Now the data-origin row is not run, saying the states carry no evidence; the
    same record with its real states is still scored (control)."""
    import json

    import torch
    from click.testing import CliRunner

    from eagleforensics.cli import main

    rec = torch.load(SAMPLES / "data_0.ckpt", weights_only=True)
    zero = {**rec, "hidden_state": torch.zeros_like(rec["hidden_state"]),
            "input_ids": torch.randint(0, 256, rec["input_ids"].shape, generator=torch.Generator().manual_seed(0))}
    (tmp_path / "zero").mkdir()
    torch.save(zero, tmp_path / "zero" / "data_0.ckpt")
    one = torch.randn(rec["hidden_state"].shape[-1], generator=torch.Generator().manual_seed(1))
    same = {**zero, "hidden_state": one.expand_as(rec["hidden_state"]).to(rec["hidden_state"].dtype).clone()}
    (tmp_path / "same").mkdir()
    torch.save(same, tmp_path / "same" / "data_0.ckpt")
    rows = {}
    for name, train in (("zero", tmp_path / "zero"), ("same", tmp_path / "same"), ("real", SAMPLES / "data_0.ckpt")):
        res = CliRunner().invoke(main, ["doctor", "--train", str(train), "--target", str(SAMPLES / "target"),
                                        "--json"])
        assert res.exit_code in (0, 1), res.output
        rows[name] = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "data-origin")
    assert rows["zero"]["status"] == "not-run" and "zero or constant" in json.dumps(rows["zero"])
    assert "from-target" not in json.dumps(rows["zero"]) and "100" not in rows["zero"].get("note", "")
    assert rows["same"]["status"] == "not-run" and "the same vector" in json.dumps(rows["same"])
    assert rows["real"]["status"] in ("clean", "found")


# ---------------------------------------------------------------------- llama3 rope_scaling without its keys

def test_llama3_rope_without_original_max_positions_is_a_finding_not_silent(tmp_path: Path) -> None:
    """Replayed silently with 8192 before; engines either fail to load it (vLLM 0.10 with transformers 4) or take
    max_position_embeddings (transformers 5.24, SGLang 0.5.23): replay takes it the same way and says so."""
    import json

    from click.testing import CliRunner

    from eagleforensics.cli import main
    from eagleforensics.io.drafter import load_drafter

    from .test_replay_hardening import DRAFTER, SWEEP, TARGET, drafter_copy

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    d = drafter_copy(tmp_path, config=lambda c: c.update(rope_scaling=scaling))
    most = json.loads((d / "config.json").read_text())["max_position_embeddings"]
    spec = load_drafter(d, target=TARGET).spec
    assert spec.rope_scaling["original_max_position_embeddings"] == most
    res = CliRunner().invoke(main, ["replay", str(d), str(SWEEP), "--target", str(TARGET), "--steps", "2", "--json"])
    assert res.exit_code in (0, 1), res.output
    found = [f for f in json.loads(res.stdout)["findings"] if f["code"] == "rope-scaling-incomplete"]
    assert len(found) == 1 and f"({most})" in found[0]["message"] and found[0]["severity"] == "warning"
    clean = CliRunner().invoke(main, ["replay", str(DRAFTER), str(SWEEP), "--target", str(TARGET), "--steps", "2",
                                      "--json"])
    assert "rope-scaling-incomplete" not in clean.stdout  # control: the sample drafter's config is complete
    lacking = drafter_copy(tmp_path / "b", config=lambda c: c.update(rope_scaling={"rope_type": "llama3",
                                                                                   "factor": 8.0}))
    code, out, err, _ = run_process(["replay", lacking, SWEEP, "--target", TARGET], tmp_path, 120)
    one_line(code, out, err, "config.json", "has no low_freq_factor, high_freq_factor", "KeyError")


# ---------------------------------------------------------------------- scan --reference reads content, not labels

N8, AUX8 = 8, [2, 4, 5]


@pytest.fixture(scope="module")
def speculators_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three speculators records (aux p2, p4, p5 and the RAW last layer, as vLLM's extraction keeps it) from a real
    forward pass, an engine sweep 0..N (its last entry raw too) and a list of the three aux states (no positions)."""
    import torch
    from safetensors.torch import save_file

    from eagleforensics.testing import drift as D
    from eagleforensics.testing.tinymodels import build_model, prompt_ids

    root = tmp_path_factory.mktemp("speculators")
    model = build_model("llama", num_layers=N8, hidden=64, seed=0)
    ids = prompt_ids(40, seed=0)
    s = D.forward_states(model, ids)
    (root / "data").mkdir()
    for i in range(3):
        stack = torch.stack([s.raw[p].to(torch.bfloat16) for p in AUX8 + [N8]], 1).contiguous()
        save_file({"token_ids": ids.clone(), "hidden_states": stack}, str(root / "data" / f"hs_{i}.safetensors"))
    save_file({f"layer.{p}": s.raw[p].contiguous() for p in range(N8 + 1)} | {"input_ids": ids.clone()},
              str(root / "sweep.safetensors"))
    torch.save({"hidden_states": [s.raw[p][None] for p in AUX8], "input_ids": ids.clone()}, root / "list.pt")
    return root


def _scan_json(root: Path, reference: Path, out: Path) -> dict:
    import json

    code, stdout, err = run_cli("scan", str(root / "data"), "--reference", str(reference), "-o", str(out),
                                "--workers", "1", "--json")
    assert code in (0, 1), err
    return json.loads(stdout)


def test_scan_names_an_engine_sweeps_raw_last_entry_by_content(speculators_data: Path, tmp_path: Path) -> None:
    """HF's convention reads a sweep's last entry as post-norm; it holds the massive row of a raw state, so the
    speculators record's raw last slot is p8, never 'p8 post-norm'."""
    res = _scan_json(speculators_data, speculators_data / "sweep.safetensors", tmp_path / "r.jsonl")
    last = next(s for s in res["slots"] if s["slot"] == "hidden_states[3]")
    assert last["resembles"].startswith("p8 (") and last["holds_on_prefix"].startswith("p8 (")
    assert "post-norm" not in json_dumps(res["slots"])
    aux = [s["holds_on_prefix"] for s in res["slots"][:3]]
    assert [a.split()[0] for a in aux] == ["p2", "p4", "p5"]  # control: the aux slots stay placed


def test_scan_names_no_position_where_labels_give_none(speculators_data: Path, tmp_path: Path) -> None:
    """A list of three aux states has indices, not positions: no slot is placed, and no JSON field names p0, p1
    or p2 as a 'best' position (each slot names the list entry its rows are nearest to)."""
    import json

    res = _scan_json(speculators_data, speculators_data / "list.pt", tmp_path / "r.jsonl")
    assert all(s["resembles"] is None and s["holds_on_prefix"] is None for s in res["slots"]), res["slots"]
    line = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[1])
    for slot in line["slots"]:
        assert slot["resembles"] is None and slot["prefix"]["position"] is None and not slot["prefix"]["confident"]
        assert "position unknown" in slot["prefix"]["nearest_entry"]


def test_align_json_names_no_best_candidate_for_an_unplaced_slot(speculators_data: Path) -> None:
    import json

    from click.testing import CliRunner

    from eagleforensics.cli import main

    rec = speculators_data / "data" / "hs_0.safetensors"
    res = CliRunner().invoke(main, ["align", str(rec), str(speculators_data / "list.pt"), "--json"])
    assert res.exit_code in (0, 1), res.output
    mapping = json.loads(res.stdout)["mapping"]
    unplaced = [m for m in mapping if m["identity"]["verdict"] == "position-unknown"]
    assert unplaced, mapping
    for m in unplaced:
        assert m["position"] is None and m["best_candidate"] is None and m["runner_up"] is None
        assert m["identity"]["other"] is None


def json_dumps(x: object) -> str:
    import json

    return json.dumps(x)
