"""Command line: ``eagleforensics <command>``. Thin: each command parses options and calls the library.

Commands live one per module in this package and are registered here; heavy imports
(torch, pandas, plotly) happen inside the command bodies so ``--help`` stays fast.
"""
from __future__ import annotations

import click

from ..process import mark_short_lived
from .common import run_guarded


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="eagleforensics")
def main() -> None:
    """Find which residual-stream position each EAGLE-3 training slot holds, and the ids each engine needs."""


def _register() -> None:
    from . import align as _align
    from . import capture as _capture
    from . import config as _config
    from . import doctor as _doctor
    from . import fingerprint as _fingerprint
    from . import logs as _logs
    from . import plan as _plan
    from . import probe as _probe
    from . import replay as _replay
    from . import report as _report
    from . import scan as _scan

    commands = (_align.align, _capture.capture, _config.config, _doctor.doctor, _fingerprint.fingerprint, _logs.logs,
                _plan.plan, _probe.probe, _replay.replay, _report.report, _scan.scan)
    for command in commands:
        main.add_command(command)


_register()


def run() -> None:
    """The program: ``eagleforensics ...`` and ``python -m eagleforensics ...``. Marks the process as one
    short command (``process``) before ``main`` runs; ``main`` called in-process (a test's CliRunner,
    a notebook) leaves its host process as it is."""
    mark_short_lived()
    main()


__all__ = ["main", "run", "run_guarded"]
