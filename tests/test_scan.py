"""Dataset scan: 2,000 generated records from real forward passes, planted faults found exactly, resumable, on Dask."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from eagleforensics.cli.scan import scan as scan_cli
from eagleforensics.errors import ForensicsError
from eagleforensics.scan.runner import find_records, load_results, scan
from eagleforensics.testing.scandata import NEEDS_REFERENCE, PLANTS, make_dataset
from eagleforensics.scan.signature import inspect_file

from .realdata import H, N, forward

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """2,000 SpecForge records with one of each planted fault, and the reference capture."""
    return make_dataset(tmp_path_factory.mktemp("scan"), 2000)


@pytest.fixture(scope="module")
def full(dataset, tmp_path_factory):
    """One local scan with the reference through a 2-process pool, written to a results file."""
    out = tmp_path_factory.mktemp("results") / "full.jsonl"
    return scan(dataset.root, reference=dataset.reference, output=out, workers=2, progress=False)


def _without_reference(planted: dict[str, str]) -> set[str]:
    return {p for p, kind in planted.items() if kind not in NEEDS_REFERENCE}


class TestPlantedFaults:
    """A scan of 2,000 records lists exactly the planted records, each with a reason naming its fault."""

    def test_local_pool_with_reference_lists_exactly_the_planted(self, dataset, full):
        assert len(dataset.planted) == len(PLANTS)
        assert full.scanned == 2000 and len(full.lines) == 2000
        assert set(full.outliers) == set(dataset.planted)
        assert full.exit_code == 1

    def test_without_reference_the_dataset_judges_itself(self, dataset):
        """Norm signatures against the dataset's median/MAD: all but the off-by-one, which needs the reference."""
        result = scan(dataset.root, workers=1, progress=False)
        assert set(result.outliers) == _without_reference(dataset.planted)

    @pytest.mark.parametrize("kind, words", [
        ("nan", ["NaN/Inf in aux_hidden_state[1]"]),
        ("embedding-layer", ["aux_hidden_state[0]: first_excess", "aux_hidden_state[0] holds p0"]),
        ("raw-final", ["hidden_state: log_norm", "hidden_state holds p8 on"]),
        ("off-by-one", ["aux_hidden_state[1] holds p5", "hold p4 there"]),
        ("shifted-padding", ["padding rows (input_ids 0) hold non-zero hidden states"]),
        ("corrupt", ["unreadable: truncated or corrupt gzip"]),
    ])
    def test_reason_names_the_fault(self, dataset, full, kind, words):
        (path,) = [p for p, k in dataset.planted.items() if k == kind]
        text = " | ".join(full.outliers[path])
        for w in words:
            assert w in text

    def test_a_record_unlike_most_is_an_outlier_a_mixed_dataset_is_not(self, full):
        """Layout is judged against the majority: one float32 record among bf16 ones is flagged; no majority, no flag."""
        from eagleforensics.scan.results import build_result

        raw = [json.loads(line) for line in Path(full.output).read_text().splitlines()[1:]]
        lines = [line for line in raw if not line["error"]][:20]
        lines[3]["slots"][0]["dtype"] = "float32"
        result = build_result("d", None, None, lines, len(lines), 0)
        assert list(result.outliers) == [lines[3]["path"]]
        assert "dtypes" in result.outliers[lines[3]["path"]][0] and "float32" in result.outliers[lines[3]["path"]][0]
        for i, line in enumerate(lines):
            line["format"] = f"format-{i % 3}"
        assert not any("format" in r for rs in build_result("d", None, None, lines, 0, 0).outliers.values() for r in rs)

    def test_summary_places_every_slot_on_the_shared_opening_tokens(self, full):
        table = full.summary().set_index("slot")
        assert table.loc["aux_hidden_state[0]", "holds_on_prefix"] == "p2 (1998/1999)"
        assert table.loc["aux_hidden_state[1]", "holds_on_prefix"] == "p4 (1998/1999)"
        assert table.loc["aux_hidden_state[2]", "holds_on_prefix"] == "p5 (1999/1999)"
        assert table.loc["hidden_state", "holds_on_prefix"].startswith("p8 post-norm")
        assert table.loc["hidden_state", "post_norm_share"] > 0.99
        assert table.loc["aux_hidden_state[0]", "post_norm_share"] == 0

    def test_dask_local_cluster_through_the_cli_gives_the_same_outliers(self, dataset, full, tmp_path):
        distributed = pytest.importorskip("distributed")
        out = tmp_path / "dask.jsonl"
        with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tcp",
                                      dashboard_address=None) as cluster:
            assert cluster.scheduler_address.startswith("tcp://")
            res = CliRunner().invoke(scan_cli, [str(dataset.root), "--reference", str(dataset.reference),
                                                "--scheduler", cluster.scheduler_address, "-o", str(out), "--json"])
        assert res.exit_code == 1, res.output
        report = json.loads(res.output)
        assert {o["path"] for o in report["outliers"]} == set(dataset.planted)
        assert report["overview"]["records"] == 2000
        assert load_results(out).outliers == full.outliers


class TestResume:
    """A scan interrupted halfway continues from its results file and ends equal to one full scan."""

    def test_half_then_resume_equals_full(self, dataset, full, tmp_path):
        lines = Path(full.output).read_text().splitlines(keepends=True)
        half = tmp_path / "half.jsonl"
        cut = lines[0] + "".join(lines[1:1001]) + lines[1001][:57]  # a killed writer leaves a half line
        half.write_text(cut)
        resumed = scan(dataset.root, reference=dataset.reference, output=half, resume=True, workers=1, progress=False)
        assert resumed.resumed == 1000 and resumed.scanned == 1000
        assert resumed.lines == full.lines
        assert resumed.outliers == full.outliers
        assert resumed.summary().equals(full.summary())
        again = half.read_text().splitlines()
        assert len(again) == 2001 and all(json.loads(line) for line in again)

    def test_ctrl_c_mid_scan_keeps_what_was_done(self, dataset, full, tmp_path, monkeypatch):
        """KeyboardInterrupt after a few batches: their lines stay in the file, --resume does only the rest."""
        import eagleforensics.scan.runner as scan_mod

        real, calls = scan_mod.inspect_batch, []

        def interrupted(*args, **kwargs):
            calls.append(1)
            if len(calls) == 5:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        out = tmp_path / "ctrl_c.jsonl"
        monkeypatch.setattr(scan_mod, "inspect_batch", interrupted)
        with pytest.raises(KeyboardInterrupt):
            scan(dataset.root, reference=dataset.reference, output=out, workers=1, progress=False)
        kept = len(out.read_text().splitlines()) - 1
        assert 0 < kept < 2000
        monkeypatch.setattr(scan_mod, "inspect_batch", real)
        resumed = scan(dataset.root, reference=dataset.reference, output=out, resume=True, workers=1, progress=False)
        assert (resumed.resumed, resumed.scanned) == (kept, 2000 - kept)
        assert resumed.lines == full.lines and resumed.outliers == full.outliers

    def test_existing_results_need_resume_and_the_same_inputs(self, dataset, full):
        with pytest.raises(ForensicsError, match="pass --resume"):
            scan(dataset.root, reference=dataset.reference, output=full.output, progress=False)
        with pytest.raises(ForensicsError, match="written for reference"):
            scan(dataset.root, output=full.output, resume=True, progress=False)
        done = scan(dataset.root, reference=dataset.reference, output=full.output, resume=True, progress=False)
        assert done.scanned == 0 and done.outliers == full.outliers


def _records(run, tmp_path: Path) -> Path:
    """A small mixed dataset written the way each producer writes it, from one real forward pass."""
    root = tmp_path / "mixed"
    (root / "rows_0-2000").mkdir(parents=True)
    bf = lambda t: t.to(torch.bfloat16).contiguous()  # noqa: E731
    s = run.ids.shape[0]
    aux = torch.cat([run.p(2), run.p(N // 2), run.p(N - 3)], dim=-1)
    torch.save({"input_ids": run.ids.clone(), "loss_mask": torch.ones(s, dtype=torch.int64),
                "hidden_state": bf(run.hs[N][None]), "aux_hidden_state": bf(aux[None])}, root / "rows_0-2000/data_0.ckpt")
    save_file({"token_ids": run.ids.clone(),
               "hidden_states": bf(torch.stack([run.p(2), run.p(N // 2), run.p(N - 3), run.raw_last], dim=1))},
              str(root / "hs_0.safetensors"))
    torch.save({"input_ids": run.ids.clone(), "hidden_states": bf(run.hs[N]), "aux_hidden_states": bf(aux),
                "conversation_id": 7}, root / "conv_7.pt")
    return root


class TestRecords:
    """Per-record checks: every producer layout reads; padding must agree with ids and loss mask."""

    def test_every_layout_reads_without_issues(self, tmp_path):
        root = _records(forward("llama"), tmp_path)
        rels = find_records(root)
        assert rels == ["conv_7.pt", "hs_0.safetensors", "rows_0-2000/data_0.ckpt"]
        lines = {rel: inspect_file(root, rel) for rel in rels}
        assert {r: line["format"] for r, line in lines.items()} == {
            "conv_7.pt": "modelopt", "hs_0.safetensors": "speculators", "rows_0-2000/data_0.ckpt": "specforge"}
        for line in lines.values():
            assert line["error"] is None and line["issues"] == [] and line["hidden_size"] == H
            assert len(line["slots"]) == 4 and all(s["log_norm"] is not None for s in line["slots"])

    def test_reference_of_another_model_is_named_and_a_reference_inside_the_dataset_is_no_record(self, dataset, tmp_path):
        root = _records(forward("llama"), tmp_path)  # H = 64; the generated dataset's reference has H = 128
        inside = root / "reference.safetensors"
        inside.write_bytes(dataset.reference.read_bytes())
        result = scan(root, reference=inside, workers=1, progress=False)
        assert len(result.lines) == 3
        assert all("differs from the reference capture's 128" in r[0] for r in result.outliers.values())
        assert len(result.outliers) == 3

    def _specforge(self, tmp_path: Path, pad: int, **change) -> dict:
        run = forward("llama")
        s = run.ids.shape[0]
        ids, mask = run.ids.clone(), torch.ones(s, dtype=torch.int64)
        fin = run.hs[N].clone()
        aux = torch.cat([run.p(2), run.p(N // 2), run.p(N - 3)], dim=-1)
        ids[s - pad:], mask[s - pad:], fin[s - pad:], aux[s - pad:] = 0, 0, 0, 0
        obj = {"input_ids": ids, "loss_mask": mask, "hidden_state": fin[None], "aux_hidden_state": aux[None]}
        for key, fn in change.items():
            obj[key] = fn(obj[key])
        torch.save(obj, tmp_path / "data_0.ckpt")
        return inspect_file(tmp_path, "data_0.ckpt")

    def test_right_padding_consistent_with_ids_and_mask_is_clean(self, tmp_path):
        line = self._specforge(tmp_path, 6)
        assert line["padding"] == 6 and line["issues"] == []

    def test_loss_mask_on_padding_is_an_issue(self, tmp_path):
        line = self._specforge(tmp_path, 6, loss_mask=lambda m: torch.cat([m[:-2], torch.ones(2, dtype=m.dtype)]))
        assert any("loss_mask is 1 on 2 padding rows" in i for i in line["issues"])

    def test_left_padding_leaves_zero_rows_under_real_ids(self, tmp_path):
        """Hidden rows padded at the front while the ids are padded at the back: rows of real tokens are zero."""
        line = self._specforge(tmp_path, 6, hidden_state=lambda t: t.roll(6, dims=1),
                               aux_hidden_state=lambda t: t.roll(6, dims=1))
        text = " | ".join(line["issues"])
        assert "real token rows have all-zero hidden states: rows 0-5" in text
        assert "padding rows (input_ids 0) hold non-zero hidden states" in text

    def test_one_slot_zeroed_under_real_tokens_is_named(self, tmp_path):
        def zero_middle_block(t):
            t = t.clone()
            t[0, 3:5, H:2 * H] = 0
            return t

        line = self._specforge(tmp_path, 6, aux_hidden_state=zero_middle_block)
        assert line["issues"] == ["2 real token rows are all-zero in aux_hidden_state[1] only: rows 3-4"]

    def test_refused_pickle_is_an_error_line_and_runs_no_code(self, tmp_path):
        torch.save({"hidden_state": torch.zeros(2, 2), "obj": Path("/x")}, tmp_path / "evil.pt")
        line = inspect_file(tmp_path, "evil.pt")
        assert line["error"].startswith("refused to unpickle")


class TestCli:
    """Bad arguments are one line on stderr and exit 2; outliers exit 1."""

    @pytest.mark.parametrize("args, message", [
        (["{missing}"], "no such dataset directory"),
        (["{file}"], "is not a directory"),
        (["{empty}"], "no training records found"),
        (["{data}", "-o", "{data}/out.jsonl"], "inside the dataset"),
        (["{data}", "--scheduler", "localhost:8786"], "tcp://HOST:PORT"),
        (["{data}", "--reference", "{missing}"], "no such reference capture"),
    ])
    def test_bad_input_exits_2_with_one_line(self, tmp_path, args, message):
        data = _records(forward("llama"), tmp_path)
        (tmp_path / "empty").mkdir()
        (tmp_path / "file.txt").write_text("x")
        fill = {"missing": tmp_path / "nope", "file": tmp_path / "file.txt", "empty": tmp_path / "empty", "data": data}
        argv = [a.format(**fill) for a in args]
        if "-o" not in argv:
            argv += ["-o", str(tmp_path / "r.jsonl")]
        res = CliRunner().invoke(scan_cli, argv)
        assert res.exit_code == 2
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("eagleforensics: error:") and message in lines[0]
        assert not (tmp_path / "r.jsonl").exists()

    def test_unreachable_scheduler_is_a_one_line_error(self, tmp_path, monkeypatch):
        pytest.importorskip("distributed")
        import eagleforensics.scan.runner as scan_mod

        monkeypatch.setattr(scan_mod, "CONNECT_TIMEOUT", "1s")
        data = _records(forward("llama"), tmp_path)
        res = CliRunner().invoke(scan_cli, [str(data), "--scheduler", "tcp://127.0.0.1:9", "-o", str(tmp_path / "r.jsonl")])
        assert res.exit_code == 2 and "cannot reach the Dask scheduler" in res.output
        assert not (tmp_path / "r.jsonl").exists()

    def test_clean_dataset_exits_0_and_writes_one_line_per_record(self, tmp_path):
        data = _records(forward("llama"), tmp_path)
        out = tmp_path / "r.jsonl"
        res = CliRunner().invoke(scan_cli, [str(data), "-o", str(out)])
        assert res.exit_code == 0, res.output
        assert "Scanned 3 records" in res.output and "no outliers" in res.output
        assert len(out.read_text().splitlines()) == 4


def test_notebook_records_the_scan_it_rendered(tmp_path):
    """papermill runs notebooks/scan.ipynb on a dataset with every planted fault; its output metadata holds the
    outliers the library's scan of the same files finds. 300 records (the notebook's demo size), not the module's
    2,000: the kernel scans on one worker, and the 2,000-record scan is asserted on above."""
    papermill = pytest.importorskip("papermill")
    import nbformat

    from eagleforensics.report.plots_scan import SUMMARY_SCHEMA
    from eagleforensics.report.pipeline import read_summary

    from .conftest import NOTEBOOK_CELL_TIMEOUT

    dataset = make_dataset(tmp_path / "scan", 300)
    full = scan(dataset.root, reference=dataset.reference, workers=1, progress=False)
    assert set(full.outliers) == set(dataset.planted)
    out = tmp_path / "scan.ipynb"
    papermill.execute_notebook(
        str(ROOT / "notebooks" / "scan.ipynb"), str(out), kernel_name="python3", progress_bar=False,
        execution_timeout=NOTEBOOK_CELL_TIMEOUT, parameters={"dataset": str(dataset.root), "reference": str(dataset.reference), "workers": 1,
                    "title": "<b>scan</b> & test"})
    nb = nbformat.read(out, as_version=4)
    summary = read_summary(nb, SUMMARY_SCHEMA)
    assert summary["overview"]["outliers"] == len(dataset.planted)
    assert {o["path"]: o["reasons"] for o in summary["outliers"]} == full.outliers
    assert summary["parameters"]["reference"] == str(dataset.reference)
    html = "".join(o.get("data", {}).get("text/html", "") for c in nb.cells for o in c.get("outputs", []))
    assert "&lt;b&gt;scan&lt;/b&gt; &amp; test" in html and "<b>scan</b>" not in html
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
