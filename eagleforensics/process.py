"""What kind of process the library runs in: a command line's one short command, or a long-lived host
(a notebook, a test run, a server). Set by the CLI; read where the two want different trade-offs."""
from __future__ import annotations

SHORT_LIVED = False  # True in an ``eagleforensics`` command (``cli.run``, the program's entry point)


def mark_short_lived() -> None:
    """This process runs one command and exits: process-wide settings that would burden a host are fine."""
    global SHORT_LIVED
    SHORT_LIVED = True
