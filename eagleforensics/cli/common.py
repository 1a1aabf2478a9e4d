"""Shared CLI plumbing: turn a ForensicsError into one line on stderr and exit code 2."""
from __future__ import annotations

import sys
from typing import Callable, TypeVar

import click

from ..errors import ForensicsError

T = TypeVar("T")


def run_guarded(fn: Callable[[], T]) -> T:
    """Call ``fn``; on bad input print ``eagleforensics: error: <message>`` and exit 2."""
    try:
        return fn()
    except ForensicsError as exc:
        click.echo(f"eagleforensics: error: {exc}", err=True)
        sys.exit(exc.exit_code)
