"""``eagleforensics probe``: check a running server after a change: healthy, what it accepts, and does it match replay."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ..errors import ForensicsError, printable
from .common import echo_text, run_guarded


@click.command("probe")
@click.argument("url")
@click.option("--engine", type=click.Choice(("sglang", "vllm")), default=None,
              help="The server's engine (default: found from the endpoints it answers).")
@click.option("--prompts", "prompts_file", type=click.Path(), default=None,
              help="Prompts, one per line (or JSON lines with \"prompt\"), instead of the records'.")
@click.option("--train", "train", multiple=True, type=click.Path(), metavar="RECORDS",
              help="Training records (files or a folder; repeatable): their prompts are sent, so replay on the same "
                   "records gives the expectation for the same text. Needs --target.")
@click.option("--target", type=click.Path(), default=None, help="The target's directory: its tokenizer decodes the "
                                                                     "records' prompts.")
@click.option("--max-tokens", type=int, default=256, show_default=True, help="Tokens to generate per request.")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--baseline", "baseline_url", metavar="URL", default=None,
              help="A server of the same target without speculation: greedy outputs are compared token by token.")
@click.option("--requests", "n_requests", type=int, default=None,
              help="Requests to send (default: one per prompt, at most 16 records or 1024 prompts; prompts are "
                   "reused in turn).")
@click.option("--concurrency", type=int, default=1, show_default=True, help="Requests in flight at once.")
@click.option("--timeout", type=float, default=120.0, show_default=True,
              help="Seconds one call to the server may take in all (connect, reply headers and body) before the "
                   "probe stops (no retries).")
@click.option("--settle", type=float, default=15.0, show_default=True,
              help="vLLM 0.7.3: seconds to wait for its counters to publish the probe's tokens.")
@click.option("--replay", "replay_json", type=click.Path(), default=None,
              help="`eagleforensics replay --json` output on the same records: runs the serving-gap test.")
@click.option("--control", is_flag=True,
              help="Positive control: compare the server with replay's figure for the trained wiring on the same "
                   "records (--train and --replay): is any loss on the serving side?")
@click.option("--drafter", "drafter", type=click.Path(), default=None, metavar="DIR",
              help="With --control instead of --replay: replay this drafter on the records probe sends (their trained "
                   "wiring; --target's weights when it holds them, else the records' own ids).")
@click.option("--since", "since", type=click.Path(), default=None, metavar="EARLIER.json",
              help="An earlier probe's --out file of this server: also the accept length of all the traffic between "
                   "its end and this probe's start (server-wide counters; SGLang needs --enable-metrics).")
@click.option("--log", "log", type=click.Path(), default=None, metavar="SERVER.log",
              help="With --since: the server's log; its decode lines between the two probes give a windowed figure "
                   "where the counters give none.")
@click.option("--api-key-env", metavar="VAR", default=None,
              help="Name of the environment variable holding the server's API key (never written anywhere).")
@click.option("--show-url", is_flag=True, help="Write the server addresses into the JSON and report (default: hidden).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema eagleforensics-probe-v1).")
@click.option("--out", "out_path", type=click.Path(), default=None,
              help="Also write the JSON to this file, all at once (a run `plan` reads like a log).")
@click.option("--report", "report_path", metavar="OUT.html", default=None,
              help="Also write the result as one offline HTML page.")
def probe(url: str, engine: str | None, prompts_file: str | None, train: tuple[str, ...], target: str | None,
          max_tokens: int, temperature: float, baseline_url: str | None, n_requests: int | None, concurrency: int,
          timeout: float, settle: float, replay_json: str | None, control: bool, drafter: str | None,
          since: str | None, log: str | None, api_key_env: str | None,
          show_url: bool, as_json: bool, out_path: str | None, report_path: str | None) -> None:
    """Probe a running SGLang or vLLM server: health, accept length per request with its SE, tok/s, serving gap.

    URL is the server's address (http://127.0.0.1:30000). The prompts are the training records' own
    (--train RECORDS --target DIR) or a file (--prompts). With --baseline, greedy outputs must match a
    server without speculation token by token. With --replay, the accept length is tested against
    replay's figure for the wiring the engine feeds. No accept length is called from too few verify
    rounds (the count is said). The URL and the key are never written unless --show-url.

    Exit 0: healthy, nothing to do. 1: something to do (see the findings). 2: bad input, a server that
    stalls past --timeout or answers malformed, or Ctrl-C (nothing written). 3: internal error.
    """

    def body():  # type: ignore[no-untyped-def]
        from ..io.guards import check_not_input, check_output_target
        from ..io.httpclient import bearer_key, check_address, check_timeout
        from ..probe import ProbeInputs, make_probe, render_html

        # everything the user typed is checked before any request is sent
        check_address(url, "the server")
        if baseline_url is not None:
            check_address(baseline_url, "--baseline")
        check_timeout(timeout)
        key = None
        if api_key_env is not None:
            source = f"--api-key-env {printable(api_key_env)[:80]}"
            key = os.environ.get(api_key_env)
            if not key:
                raise ForensicsError(f"{source}: that environment variable is not set")
            key = bearer_key(key, f"{source} (the environment variable)")
        if report_path is not None and not report_path.lower().endswith((".html", ".htm")):
            raise ForensicsError(f"--report expects an .html file name, got {report_path!r}")
        for path, what in ((out_path, "--out run"), (report_path, "--report page")):
            if path is not None:  # the same guard the write applies, before any request rather than after all
                check_output_target(path, what)
                check_not_input(path, (), what)
        if drafter is not None and (not control or replay_json is not None):
            raise ForensicsError("--drafter is for --control without --replay: it replays the drafter on the records "
                                 "probe sends")
        inputs = ProbeInputs(url, engine=engine, prompts=prompts_file, train=train, target=target,
                             max_tokens=max_tokens, temperature=temperature, baseline=baseline_url,
                             requests=n_requests, concurrency=concurrency, timeout=timeout, replay=replay_json,
                             api_key=key, show_url=show_url, settle=settle, control=control,
                             since=since, log=log)
        import tempfile
        from dataclasses import replace

        from ..io.atomic import write_bytes_atomic

        try:
            with tempfile.TemporaryDirectory(prefix="eagleforensics-control-") as tmp:
                if drafter is not None:
                    from ..probe import DEFAULT_RECORDS, _record_files
                    from .probecontrol import control_replay

                    if not train:
                        raise ForensicsError("--control needs --train RECORDS: the records replay scores and probe "
                                             "sends")
                    records = _record_files(train)[:n_requests or DEFAULT_RECORDS]
                    inputs = replace(inputs, replay=str(control_replay(drafter, records, target,
                                                                       Path(tmp) / "control_replay.json")))
                rep = make_probe(inputs)
            if out_path is not None:
                write_bytes_atomic(out_path, (rep.to_json() + "\n").encode())
            if report_path is not None:
                write_bytes_atomic(report_path, render_html(rep).encode())
        except KeyboardInterrupt as exc:
            if type(exc) is not KeyboardInterrupt:  # SIGTERM keeps its own exit (143)
                raise
            raise ForensicsError("interrupted (Ctrl-C): the probe stopped; no file was left half-written") from None
        return rep, (rep.to_json() if as_json else rep.to_text())

    rep, text = run_guarded(body)
    echo_text(text)
    for path, what in ((out_path, "run"), (report_path, "report")):
        if path is not None:  # on stderr with --json, so stdout stays one JSON document
            echo_text(f"{what}: {printable(path)}", err=as_json)
    sys.exit(rep.exit_code)
