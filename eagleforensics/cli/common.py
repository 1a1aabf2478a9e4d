"""Shared CLI plumbing: turn a ForensicsError into one line on stderr and exit code 2.

Anything else that escapes a command is a bug in eagleforensics, not bad input: it is
printed as one ``internal error`` line with exit code 3 (set ``EAGLEFORENSICS_TRACEBACK=1``
to see the traceback instead). Ctrl-C and SIGTERM unwind the command (its temporary files,
a report's work folder and kernel are removed on the way out) and end in one line, exit 130 / 143.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, TypeVar

import click

from ..errors import ForensicsError, path_error, printable
from ..interrupts import exit_code, signals_unwind, what

T = TypeVar("T")
TRACEBACK_ENV = "EAGLEFORENSICS_TRACEBACK"
INTERNAL_EXIT = 3


def run_guarded(fn: Callable[[], T]) -> T:
    """Call ``fn``; on bad input print ``eagleforensics: error: <message>`` and exit 2 (3 on a bug).

    While ``fn`` runs SIGTERM raises ``interrupts.Terminated``, so it unwinds as Ctrl-C does.
    """
    from ..io.guards import declared_inputs

    try:
        with signals_unwind(), declared_inputs(command_inputs()):
            return fn()
    except ForensicsError as exc:  # one line even when a file name holds a newline
        click.echo(f"eagleforensics: error: {printable(exc)}", err=True)
        sys.exit(exc.exit_code)
    except (click.exceptions.Exit, click.Abort, click.ClickException):
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated)
        click.echo(f"eagleforensics: {what(exc)}", err=True)
        sys.exit(exit_code(exc))
    except OSError as exc:  # the OS refused a path the user gave (a name too long, no permission): bad input
        bad = path_error(exc)
        if bad is None or os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
            _internal(exc)
        click.echo(f"eagleforensics: error: {printable(bad)}", err=True)
        sys.exit(bad.exit_code)
    except Exception as exc:  # last resort: a bug must not dump a traceback on the user
        _internal(exc)


# the parameters that name what a command writes (every writing option of every command: tests/test_probe_hardening.py)
OUTPUT_PARAMS = frozenset({"output", "report_path", "out_path", "profile_out"})


def command_inputs() -> list[tuple[str, str]]:
    """Every existing path the running command was given (its arguments and its ``click.Path`` options, but its
    outputs), as ``(path, role)``: what no writer may write over or into (``io.guards.check_not_input``). A
    ``LABEL=PATH`` argument counts by its PATH."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return []
    out: list[tuple[str, str]] = []
    for param in ctx.command.params:
        if param.name is None or param.name in OUTPUT_PARAMS:
            continue
        if not (isinstance(param.type, click.Path) or isinstance(param, click.Argument)):
            continue  # free text (--title, --engine) is never a path, even when a folder of that name exists
        value = ctx.params.get(param.name)
        role = (max(param.opts, key=len) if isinstance(param, click.Option) else param.name.upper())  # as typed
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if not isinstance(v, (str, os.PathLike)) or isinstance(v, bool):
                continue
            text = os.fspath(v)
            for candidate in (text, text.partition("=")[2]):
                if candidate and len(candidate) < 4096 and "\0" not in candidate and os.path.lexists(candidate):
                    out.append((candidate, f"the input {role}"))
                    break
    return out


def _internal(exc: BaseException) -> None:
    """One ``internal error`` line and exit 3 (with ``EAGLEFORENSICS_TRACEBACK=1``: the traceback)."""
    if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
        raise exc
    text = " ".join(printable(exc).split())[:300]
    click.echo(f"eagleforensics: internal error: {type(exc).__name__}: {text} "
               f"(a bug; set {TRACEBACK_ENV}=1 for the traceback and report it)", err=True)
    sys.exit(INTERNAL_EXIT)


def echo_text(text: str, err: bool = False) -> None:
    """Print text the program built (a table, a verdict) with every control character but its line breaks escaped.

    Fields a file controls (key names, paths found in a dataset) are escaped where they are
    put into the text (``printable``); this pass makes sure no escape sequence reaches the terminal.
    """
    click.echo(printable(text, keep_newlines=True), err=err)


def rule_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--engine-version``, ``--vllm-runner`` and ``--model-type``: which engine rule applies (align, config)."""
    options = [
        click.option("--engine-version", default=None,
                     help="Engine version, e.g. 0.5.12.post1; default: the newest release the rules know "
                          "(said in the output)."),
        click.option("--vllm-runner", type=click.Choice(("v1", "v2")), default=None,
                     help="vLLM model runner (default: the one that vLLM version picks for the model); decides "
                          "which key is read."),
        click.option("--model-type", default=None,
                     help="Target model_type for the engine rule (llama, qwen3, qwen3_moe, deepseek_v3, kimi_k2, "
                          "kimi_k25, gpt_oss, ...)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command
