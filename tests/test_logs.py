"""Server-log parsing: exact values from each engine's fixture, decoys ignored, summaries and CLI."""
from __future__ import annotations

import gzip
import json
import math
from datetime import datetime
from pathlib import Path
from statistics import median

import pandas as pd
import pytest
from click.testing import CliRunner

from eagleforensics.errors import ForensicsError
from eagleforensics.engines.logs import COLUMNS, SUMMARY_COLUMNS, parse_log, parse_logs, summarize_runs

FIX = Path(__file__).parent / "fixtures" / "logs"
BASELINE = FIX / "sglang_0.4_baseline.log"
BROKEN = FIX / "sglang_0.5.5_broken.log"
FIXED = FIX / "sglang_0.5.23_fixed.log"
VLLM = FIX / "vllm_0.33.log"

# The numbers written in the fixtures' data lines, read by eye, in file order.
BASELINE_TOK_S = [88.41, 90.12, 91.05, 89.77, 90.60, 90.33, 87.95, 90.88]
BROKEN_LEN = [1.58, 1.62, 1.60, 1.55, 1.64, 1.59, 1.61, 1.57, 1.63]
BROKEN_RATE = [0.40, 0.41, 0.40, 0.39, 0.41, 0.40, 0.40, 0.39, 0.41]
BROKEN_TOK_S = [54.10, 55.82, 55.01, 53.47, 56.40, 54.66, 55.29, 54.02, 56.11]
FIXED_LEN = [3.18, 3.22, 3.20, 3.25, 3.15, 3.21, 3.19, 3.24]
FIXED_RATE = [0.73, 0.74, 0.73, 0.75, 0.72, 0.74, 0.73, 0.75]
FIXED_TOK_S = [149.30, 151.02, 150.47, 152.88, 147.91, 150.66, 149.85, 152.10]
VLLM_LEN = [1.58, 1.58, 1.57, 1.60, 1.55, 1.60, 1.58]
VLLM_PCT = [19.3, 19.3, 19.0, 19.9, 18.3, 20.0, 19.4]
VLLM_TOK_S = [40.1, 55.3, 55.3, 55.4, 55.0, 55.8, 9.5]  # the last interval has Running: 0 reqs
VLLM_RUNNING = [1, 1, 1, 1, 1, 1, 0]


def _lines_with(path: Path, needle: str) -> list[int]:
    """1-based numbers of the lines containing ``needle``: an independent count of data lines."""
    return [i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line]


def test_every_fixture_names_its_source_on_the_first_line():
    for path in (BASELINE, BROKEN, FIXED, VLLM):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# format copied from "), path.name


def test_baseline_without_speculation_still_reads_throughput():
    df = parse_log(BASELINE, run="baseline")
    assert list(df.columns) == COLUMNS
    assert len(df) == 8
    assert df.attrs["engine"] == "sglang"
    assert df["line"].tolist() == _lines_with(BASELINE, "Decode batch.")
    assert df["gen_throughput"].tolist() == BASELINE_TOK_S
    assert df["accept_length"].isna().all() and df["accept_rate"].isna().all()
    assert (df["running_req"] == 1).all()
    assert (df["rank"] == "TP0").all()
    first = df.iloc[0]
    assert first["line"] == 7 and first["time"] == pd.Timestamp("2026-11-29 10:00:01")
    assert set(df["run"]) == {"baseline"}


def test_broken_sglang_055_values_and_decoys():
    df = parse_log(BROKEN)
    assert len(df) == 9
    assert df["run"].iloc[0] == "sglang_0.5.5_broken"  # default label: file name without .log
    assert df["accept_length"].tolist() == BROKEN_LEN
    assert df["accept_rate"].tolist() == BROKEN_RATE
    assert df["gen_throughput"].tolist() == BROKEN_TOK_S
    assert df["rank"].isna().all()  # tp_size=1: no rank tag in the prefix
    row = df[df["line"] == 11].iloc[0]
    assert (row["accept_length"], row["accept_rate"], row["gen_throughput"]) == (1.64, 0.41, 56.40)
    assert row["time"] == pd.Timestamp("2026-11-29 11:00:05")
    # decoys that say "accept": server args, the accept-len warning, the Finish line's spec_accept_length
    text = BROKEN.read_text().splitlines()
    decoys = [i for i, line in enumerate(text, 1) if "accept" in line and "Decode batch" not in line]
    assert decoys == [2, 5, 12]
    assert not set(decoys) & set(df["line"])
    assert not set(_lines_with(BROKEN, "Prefill batch")) & set(df["line"])


def test_fixed_sglang_0523_milliseconds_and_rank():
    df = parse_log(FIXED)
    assert len(df) == 8
    assert df["accept_length"].tolist() == FIXED_LEN
    assert df["accept_rate"].tolist() == FIXED_RATE
    assert df["gen_throughput"].tolist() == FIXED_TOK_S
    assert df["time"].iloc[1] == pd.Timestamp("2026-11-29 12:00:02.137")
    assert df["line"].tolist() == [5, 6, 7, 8, 11, 12, 13, 14]
    # prefill lines print "input throughput (token/s)": not generation throughput
    assert 3120.55 not in df["gen_throughput"].tolist()


def test_sglang_accept_rate_definitions_differ_by_version():
    """Same chain draft (steps=3): <=0.5.10 logs L/(steps+1), >=0.5.11 logs (L-1)/steps."""
    broken, fixed = parse_log(BROKEN), parse_log(FIXED)
    assert all(round(a / 4, 2) == r for a, r in zip(broken["accept_length"], broken["accept_rate"]))
    assert all(round((a - 1) / 3, 2) == r for a, r in zip(fixed["accept_length"], fixed["accept_rate"]))


def test_vllm_spec_and_throughput_lines():
    df = parse_log(VLLM, run="vllm")
    assert df.attrs["engine"] == "vllm"
    assert len(df) == 14
    spec = df[df["accept_length"].notna()]
    tput = df[df["gen_throughput"].notna()]
    assert spec["line"].tolist() == _lines_with(VLLM, "SpecDecoding metrics:")
    assert tput["line"].tolist() == _lines_with(VLLM, "Avg generation throughput:")
    assert spec["accept_length"].tolist() == VLLM_LEN
    assert spec["draft_acceptance_rate"].tolist() == VLLM_PCT
    assert spec["accept_rate"].tolist() == pytest.approx([p / 100 for p in VLLM_PCT])
    assert tput["gen_throughput"].tolist() == VLLM_TOK_S
    assert tput["running_req"].tolist() == VLLM_RUNNING
    assert (tput["rank"] == "Engine 000").all()
    row = df[df["line"] == 9].iloc[0]
    assert row["per_position_acceptance"] == [0.411, 0.129, 0.040]
    assert row["time"] == pd.Timestamp(datetime(2000, 11, 29, 13, 0, 20))  # vLLM prints no year
    assert tput["per_position_acceptance"].isna().all()
    # decoys: non-default args (speculative_config), the warning naming "Mean acceptance length"
    assert not {2, 3, 4, 5} & set(df["line"])


def test_vllm_line_without_process_tag_and_with_ansi_colour(tmp_path):
    path = tmp_path / "old.log"
    path.write_text(
        "INFO 11-29 10:00:01 [metrics.py:123] SpecDecoding metrics: Mean acceptance length: 3.20, "
        "Accepted throughput: 60.00 tokens/s, Drafted throughput: 90.00 tokens/s, Accepted: 600 tokens, "
        "Drafted: 900 tokens, Per-position acceptance rate: 0.900, 0.750, 0.550, "
        "Avg Draft acceptance rate: 66.7%\r\n"
        "\x1b[32mINFO\x1b[0m 11-29 10:00:01 \x1b[90m[loggers.py:127]\x1b[0m Avg prompt throughput: 0.0 tokens/s, "
        "Avg generation throughput: 150.2 tokens/s, Running: 4 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%\n"
    )
    df = parse_log(path)
    assert df.attrs["engine"] == "vllm"
    assert df["accept_length"].iloc[0] == 3.20
    assert df["per_position_acceptance"].iloc[0] == [0.9, 0.75, 0.55]
    assert df["gen_throughput"].iloc[1] == 150.2 and df["running_req"].iloc[1] == 4
    assert df["time"].notna().all()


def test_auto_detection_and_forced_engine():
    assert parse_log(BROKEN).attrs["engine"] == "sglang"
    assert parse_log(VLLM).attrs["engine"] == "vllm"
    assert parse_log(BROKEN, engine="sglang")["accept_length"].tolist() == BROKEN_LEN
    wrong = parse_log(BROKEN, engine="vllm")
    assert wrong.empty and wrong.attrs["engine"] is None
    with pytest.raises(ForensicsError, match="unknown engine"):
        parse_log(BROKEN, engine="trtllm")


def test_lines_that_only_mention_accept_are_not_data(tmp_path):
    path = tmp_path / "noise.log"
    path.write_text(
        "# format copied from nowhere: a comment line, not a log line\n"
        "[2026-11-29 10:00:00] server_args=ServerArgs(speculative_accept_threshold_single=1.0, "
        "speculative_accept_threshold_acc=1.0)\n"
        "[2026-11-29 10:00:01] Warning: accept len: 0.00 looks low; accept rate: 0.00\n"
        "[2026-11-29 10:00:02] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, "
        "#running-req: 0, #queue-req: 0, \n"
        "# Decode batch, #running-req: 1, accept len: 9.99, gen throughput (token/s): 999.00, #queue-req: 0\n"
    )
    df = parse_log(path, run="noise")
    assert df.empty and list(df.columns) == COLUMNS
    assert df.attrs["engine"] is None and df.attrs["lines_read"] == 5
    summary = summarize_runs(df)
    assert summary.empty and list(summary.columns) == SUMMARY_COLUMNS


def test_gzip_log_is_read(tmp_path):
    path = tmp_path / "fixed.log.gz"
    path.write_bytes(gzip.compress(FIXED.read_bytes()))
    df = parse_log(path)
    assert df["run"].iloc[0] == "fixed"
    assert df["accept_length"].tolist() == FIXED_LEN


@pytest.mark.parametrize("make", ["missing", "binary", "directory"])
def test_unusable_file_raises_naming_it(tmp_path, make):
    path = tmp_path / f"{make}.log"
    if make == "binary":
        path.write_bytes(b"\x7fELF\x00\x00\x01" * 100)
    elif make == "directory":
        path.mkdir()
    with pytest.raises(ForensicsError) as info:
        parse_log(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_summary_medians_and_speedup_computed_independently():
    df = parse_logs({"baseline": BASELINE, "broken": BROKEN, "fixed": FIXED, "vllm": VLLM})
    assert df.attrs["empty_runs"] == []
    s = summarize_runs(df, baseline="baseline").set_index("run")
    assert list(s.index) == ["baseline", "broken", "fixed", "vllm"]
    base = median(BASELINE_TOK_S)
    assert base == pytest.approx(90.225)
    assert s.loc["baseline", "n_lines"] == 8 and math.isnan(s.loc["baseline", "median_accept_length"])
    assert s.loc["baseline", "speedup"] == pytest.approx(1.0)
    assert s.loc["broken", "median_accept_length"] == pytest.approx(median(BROKEN_LEN))
    assert s.loc["broken", "median_accept_rate"] == pytest.approx(median(BROKEN_RATE))
    assert s.loc["broken", "median_tok_s"] == pytest.approx(median(BROKEN_TOK_S))
    assert s.loc["broken", "speedup"] == pytest.approx(median(BROKEN_TOK_S) / base)
    assert s.loc["fixed", "median_accept_length"] == pytest.approx(3.205)
    assert s.loc["fixed", "median_tok_s"] == pytest.approx(150.565)
    assert s.loc["fixed", "speedup"] == pytest.approx(150.565 / 90.225)
    assert s.loc["fixed", "speedup"] > 1.6 > 1 > s.loc["broken", "speedup"]
    busy = [t for t, r in zip(VLLM_TOK_S, VLLM_RUNNING) if r > 0]  # idle interval skipped
    assert s.loc["vllm", "median_tok_s"] == pytest.approx(median(busy)) == pytest.approx(55.3)
    assert s.loc["vllm", "median_accept_rate"] == pytest.approx(median(VLLM_PCT) / 100)
    assert s.loc["vllm", "n_lines"] == 14


def test_summary_without_baseline_and_with_unknown_baseline():
    df = parse_logs({"broken": BROKEN, "fixed": FIXED})
    assert summarize_runs(df)["speedup"].isna().all()
    with pytest.raises(ForensicsError, match="baseline run 'nope' not found"):
        summarize_runs(df, baseline="nope")


def test_parse_logs_reports_runs_without_data(tmp_path):
    empty = tmp_path / "client.log"
    empty.write_text("Successful requests: 16\nAccept length: 3.20\n")
    df = parse_logs({"fixed": FIXED, "client": empty})
    assert df.attrs["empty_runs"] == ["client"]
    assert set(df["run"]) == {"fixed"}


# ---- CLI ----------------------------------------------------------------------------------

def _cli():
    from eagleforensics.cli.logs import logs

    return logs


def test_cli_table_and_json():
    runner = CliRunner()
    args = [f"baseline={BASELINE}", f"broken={BROKEN}", f"fixed={FIXED}", "--baseline", "baseline"]
    res = runner.invoke(_cli(), args)
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0].split() == SUMMARY_COLUMNS and len(lines) == 4
    assert "1.669" in lines[3] and "150.565" in lines[3]
    res = runner.invoke(_cli(), args + ["--json"])
    assert res.exit_code == 0, res.output
    records = json.loads(res.output)
    assert [r["run"] for r in records] == ["baseline", "broken", "fixed"]
    assert records[0]["median_accept_length"] is None and records[0]["n_lines"] == 8
    assert records[2]["speedup"] == pytest.approx(150.565 / 90.225)


@pytest.mark.parametrize("value", ["inf", "1e999"])
def test_a_baseline_of_no_finite_rate_gives_no_speed_up_but_a_note(tmp_path, value):
    """A baseline logging inf tok/s (or a number past the float range) gave every other run "speedup 0.000" (x / inf)."""
    import re

    base = tmp_path / "base.log"
    base.write_text(re.sub(r"gen throughput \(token/s\): [0-9.]+", f"gen throughput (token/s): {value}",
                           BASELINE.read_text()))
    df = summarize_runs(parse_logs({"base": base, "fixed": FIXED}), baseline="base")
    assert df["speedup"].isna().all()
    assert len(df.attrs["notes"]) == 1 and "'base'" in df.attrs["notes"][0] and "n/a" in df.attrs["notes"][0]
    runner = CliRunner()
    res = runner.invoke(_cli(), [f"base={base}", f"fixed={FIXED}", "--baseline", "base"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    column = lines[0].split().index("speedup")  # runs have one-word cells up to the launch columns
    assert lines[2].split()[column] == "n/a" and "0.000" not in lines[2]  # the fixed run: no bogus speed-up
    assert lines[3].startswith("note: the baseline run 'base' logged a median tok/s of ")
    res = runner.invoke(_cli(), [f"base={base}", f"fixed={FIXED}", "--baseline", "base", "--json"])
    assert [r["speedup"] for r in json.loads(res.stdout)] == [None, None]  # stdout stays one JSON document
    assert res.stderr.startswith("note: the baseline run 'base'")


def test_a_run_of_no_finite_rate_gets_no_speed_up(tmp_path):
    import re

    run = tmp_path / "run.log"
    run.write_text(re.sub(r"gen throughput \(token/s\): [0-9.]+", "gen throughput (token/s): inf",
                          FIXED.read_text()))
    df = summarize_runs(parse_logs({"base": BASELINE, "inf": run}), baseline="base")
    assert df.loc[df["run"] == "base", "speedup"].iloc[0] == pytest.approx(1.0)
    assert math.isnan(df.loc[df["run"] == "inf", "speedup"].iloc[0])
    assert any("'inf'" in n for n in df.attrs["notes"])


@pytest.mark.parametrize("args, needle", [
    (["fixed=/no/such/file.log"], "/no/such/file.log"),
    (["justapath.log"], "no such file or directory (parameter logs['justapath'])"),  # a bare PATH: label = name
    (["=b.log"], "expected LABEL=PATH or PATH"),
    ([f"a={FIXED}", f"a={BROKEN}"], "given twice"),
    ([f"a={FIXED}", "--baseline", "b"], "--baseline 'b'"),
])
def test_cli_bad_input_one_line_exit_2(args, needle):
    res = CliRunner().invoke(_cli(), args)
    assert res.exit_code == 2
    out = res.output.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("eagleforensics: error: ") and needle in out[0]


def test_cli_log_without_data_is_an_error(tmp_path):
    empty = tmp_path / "client.log"
    empty.write_text("Accept length: 3.20\n")
    res = CliRunner().invoke(_cli(), [f"fixed={FIXED}", f"client={empty}"])
    assert res.exit_code == 2 and str(empty) in res.output and len(res.output.strip().splitlines()) == 1


# ---- plots --------------------------------------------------------------------------------

def test_figures_have_one_trace_per_run():
    import plotly.graph_objects as go

    from eagleforensics.report.plots_runs import accept_length_over_time, throughput_over_time

    df = parse_logs({"baseline": BASELINE, "broken": BROKEN, "fixed": FIXED})
    acc = accept_length_over_time(df)
    tput = throughput_over_time(df, relative=True)
    assert isinstance(acc, go.Figure) and isinstance(tput, go.Figure)
    assert [t.name for t in tput.data] == ["baseline", "broken", "fixed"]
    assert len(acc.data) == 3 and acc.data[0].name.startswith("baseline (no")
    assert list(acc.data[2].y) == FIXED_LEN
    assert list(tput.data[0].y) == BASELINE_TOK_S and tput.data[2].x[0] == 0.0
    no_time = df.assign(time=pd.NaT)
    assert list(throughput_over_time(no_time).data[1].x) == df[df["run"] == "broken"]["line"].tolist()


# ---- the server's arguments line ------------------------------------------------------------

STARTED = FIX / "sglang_0.5.23_started.log"


def test_summary_carries_each_runs_launch_arguments():
    df = parse_logs({"baseline": BASELINE, "broken": BROKEN, "vllm": VLLM})
    s = summarize_runs(df, baseline="baseline").set_index("run")
    assert list(s.columns[-4:]) == ["algorithm", "num_steps", "topk", "num_draft_tokens"]
    assert s.loc["baseline", "algorithm"] is None and s.loc["baseline", "num_steps"] is None
    assert tuple(s.loc["broken", ["algorithm", "num_steps", "topk", "num_draft_tokens"]]) == ("eagle3", 3, 1, 4)
    # vLLM: 3 speculative tokens = 3 steps of a chain, 4 tokens per verify pass
    assert tuple(s.loc["vllm", ["algorithm", "num_steps", "topk", "num_draft_tokens"]]) == ("eagle3", 3, 1, 4)
    assert parse_log(BROKEN).attrs["server_args"].line_no == 2


def test_started_server_without_decode_lines_is_not_called_a_wrong_file():
    df = parse_log(STARTED)
    assert df.empty and df.attrs["server_args"].algorithm == "eagle3"
    runs = parse_logs({"started": STARTED, "fixed": FIXED})
    assert runs.attrs["empty_runs"] == ["started"] and runs.attrs["waiting_runs"] == ["started"]
    s = summarize_runs(runs).set_index("run")
    assert s.loc["started", "n_lines"] == 0 and s.loc["started", "engine"] == "sglang"
    assert list(s.index) == ["started", "fixed"]


def test_cli_bare_path_takes_the_file_name_and_explains_a_started_server():
    res = CliRunner().invoke(_cli(), [str(STARTED)])
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert lines[0].split() == SUMMARY_COLUMNS and lines[1].split()[:3] == ["sglang_0.5.23_started", "sglang", "0"]
    assert lines[-1] == (
        "sglang_0.5.23_started: server started with EAGLE3 (draft yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, 3 steps, "
        "topk 1, 4 draft tokens); no decode statistics yet: SGLang prints a 'Decode batch' line every "
        "decode_log_interval decode batches (40 here); send a longer request")
    assert "is this the server log" not in res.output


def test_cli_json_has_server_args_and_note_per_run():
    res = CliRunner().invoke(_cli(), [f"fixed={FIXED}", str(STARTED), "--json"])
    assert res.exit_code == 1
    records = json.loads(res.stdout)
    assert [r["run"] for r in records] == ["fixed", "sglang_0.5.23_started"]
    fixed, started = records
    assert fixed["note"] is None and fixed["server_args"]["algorithm"] == "eagle3" and fixed["num_draft_tokens"] == 4
    assert started["server_args"]["decode_log_interval"] == 40 and started["n_lines"] == 0
    assert "no decode statistics yet" in started["note"] and "no decode statistics yet" in res.stderr
    ok = CliRunner().invoke(_cli(), [str(FIXED), "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)[0]["run"] == "sglang_0.5.23_fixed"


@pytest.mark.parametrize("extra, needle", [
    ("", "every VLLM_LOG_STATS_INTERVAL seconds (10 by default)"),
    (", 'disable_log_stats': True", "started with --disable-log-stats"),
])
def test_vllm_started_server_note(tmp_path, extra, needle):
    log = tmp_path / "vllm_started.log"
    log.write_text("(APIServer pid=1) INFO 11-29 12:58:00 [startup.py:96] non-default args: {'model_tag': 'm', "
                   f"'speculative_config': {{'method': 'eagle3', 'model': 'd', 'num_speculative_tokens': 2}}{extra}}}\n")
    res = CliRunner().invoke(_cli(), [str(log)])
    assert res.exit_code == 1 and needle in res.output
    assert "server started with eagle3 (draft d, 2 speculative tokens)" in res.output


def test_vllm_0100_note_says_every_10_s(tmp_path):
    log = tmp_path / "old.log"
    log.write_text("INFO 11-29 12:58:00 [api_server.py:1755] vLLM API server version 0.10.0\n"
                   "INFO 11-29 12:58:00 [cli_args.py:261] non-default args: {'model_tag': 'm'}\n")
    res = CliRunner().invoke(_cli(), [str(log)])
    assert res.exit_code == 1 and "server started with no speculative decoding" in res.output
    assert "lines every 10 s," in res.output


def test_report_path_refuses_a_started_server_with_the_reason(tmp_path):
    from eagleforensics.report import runs as runs_report

    params = runs_report.validate_params({"started": str(STARTED)})
    with pytest.raises(ForensicsError, match="no decode statistics yet") as info:
        runs_report.load_runs(params)
    assert str(STARTED) in str(info.value)
    df = runs_report.load_runs(params, allow_waiting=True)
    record = runs_report.runs_summary(runs_report.summarize(df, params), params)
    assert record["exit_code"] == 1 and record["runs"][0]["note"].startswith("server started with EAGLE3")
    assert runs_report.display_table(runs_report.summarize(df, params))["launch"].tolist() == [
        "EAGLE3: steps 3, topk 1, draft tokens 4"]
