"""Provenance of a shared report: what was compared, by which tool, with which command; the result, embedded.

A report moved to another machine must still say which files (size and a content hash),
which versions and which command produced it. ``collect`` gathers that in the process that
builds the report (before the kernel starts, so files are hashed once); ``shown_path`` is
how a path appears in the page (relative to the working directory, or the name only with
``redact``); ``embed`` writes the whole result JSON into the page inside a
``<script type="application/json">`` element whose text cannot close the element, and
``read_report`` reads it back from a saved page.
"""
from __future__ import annotations

import functools
import hashlib
import html
import json
import os
import re
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from ..errors import ForensicsError
from ..io.guards import open_regular, parse_json, read_regular

EMBED_ID = "eagleforensics-result"
EMBED_SCHEMA = "eagleforensics-report-v1"
HASH_NAME = "blake2b-128"
_CHUNK = 1 << 20
_EMBED_OPEN = f'<script type="application/json" id="{EMBED_ID}">'
MAX_REPORT_BYTES = 512 * 1024 * 1024  # a report page with inline plotly is a few MiB


def file_hash(path: str | os.PathLike[str]) -> str:
    """BLAKE2b (16-byte digest) of a file's bytes, read in 1 MiB chunks: fast, in the standard library."""
    h = hashlib.blake2b(digest_size=16)
    with open_regular(path, "input file") as f:  # a FIFO swapped in since validation is refused, not waited on
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def shown_path(path: str | os.PathLike[str], cwd: Path | None = None, redact: bool = False) -> str:
    """A path as a shared page shows it, judged by where it resolves to: relative to ``cwd`` (the working
    directory), or its name only. ``../dir/file`` or a path through a symlinked folder shows no other directory."""
    p = Path(os.path.realpath(Path(cwd or Path.cwd()) / Path(path).expanduser()))
    if redact:
        return p.name
    try:
        return os.path.relpath(p, os.path.realpath(cwd or Path.cwd()))
    except ValueError:  # another drive on Windows
        return p.name


def input_record(role: str, path: str | os.PathLike[str], cwd: Path | None = None, *, hash_files: bool = True,
                 redact: bool = False) -> dict[str, Any]:
    """One input: its role, shown path, size and content hash (a directory: every file under it, in order)."""
    p = Path(path)
    files = sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
    size = sum(q.stat().st_size for q in files)
    digest = None
    if hash_files:
        if p.is_dir():
            h = hashlib.blake2b(digest_size=16)
            for q in files:
                h.update(q.relative_to(p).as_posix().encode() + b"\0" + file_hash(q).encode())
            digest = h.hexdigest()
        else:
            digest = file_hash(p)
    return {"role": role, "path": shown_path(p, cwd, redact), "bytes": size, "files": len(files),
            "hash": None if digest is None else f"{HASH_NAME}:{digest}"}


def versions() -> dict[str, str]:
    """eagleforensics, torch and Python versions ("not installed" for a missing one)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("eagleforensics", "torch"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    out["python"] = sys.version.split()[0]
    return out


def collect(inputs: Iterable[tuple[str, str | os.PathLike[str]]], *, command: list[str] | None = None,
            parameters: dict[str, Any] | None = None, notebook: str | None = None, hash_files: bool = True,
            redact: bool = False, cwd: Path | None = None) -> dict[str, Any]:
    """The provenance record: created (UTC), versions, the command (or papermill call) that reproduces it, inputs."""
    cwd = cwd or Path.cwd()
    params = {k: _shown_value(v, cwd, redact) for k, v in (parameters or {}).items()}
    if command is not None:  # every word naming an existing file or folder, shown as the inputs are
        command = [_shown_word(str(c), cwd, redact) for c in command]
    if command is None and notebook is not None:  # no CLI line: the papermill call that reproduces it
        command = ["papermill", notebook, "out.ipynb"] + [
            x for k, v in params.items() if v is not None and not isinstance(v, (dict, list))
            for x in ("-p", k, str(v))]
    return {
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": versions(),
        "command": None if command is None else " ".join(shlex.quote(str(c)) for c in command),
        "parameters": params,
        "inputs": [input_record(role, path, cwd, hash_files=hash_files, redact=redact) for role, path in inputs],
        "hash": HASH_NAME if hash_files else None,
        "paths": "names only" if redact else "relative to the working directory",
    }


def _shown_value(value: Any, cwd: Path, redact: bool) -> Any:
    if isinstance(value, str) and os.path.isabs(value) and os.path.exists(value):
        return shown_path(value, cwd, redact)
    return value


def _shown_word(word: str, cwd: Path, redact: bool) -> str:
    """A command-line word: a path to something that exists (``--flag=PATH`` too) as ``shown_path`` shows it."""
    flag, eq, value = word.partition("=") if word.startswith("-") else ("", "", word)
    if value and not value.startswith("-") and _exists(cwd, value):
        return flag + eq + shown_path(value, cwd, redact)
    return word


def _exists(cwd: Path, value: str) -> bool:
    try:
        return os.path.lexists(Path(cwd) / Path(value).expanduser())
    except (OSError, ValueError):  # a name too long for the OS, a NUL byte
        return False


def command_paths(command: Iterable[str] | None, cwd: Path | None = None) -> list[str]:
    """The words of ``command`` that name an existing file or folder (``--flag=PATH`` too), as given."""
    out = []
    for word in command or ():
        word = str(word)
        value = word.partition("=")[2] if word.startswith("-") else word
        if value and not value.startswith("-") and _exists(cwd or Path.cwd(), value):
            out.append(value)
    return out


def path_map(inputs: Iterable[str | os.PathLike[str]], cwd: Path | None = None, redact: bool = False
             ) -> dict[str, str]:
    """Every absolute form of each input path -> how the page shows it; longest first, so nested paths are replaced right.

    The forms are the resolved path (symlinks followed, what the notebook is given), the
    absolute path as given (``/work/../dir/f``, ``/work/linked/f``) and its lexical
    normalisation: a page or notebook that prints any of them shows the resolved path's form.
    """
    base = Path(cwd or Path.cwd())
    pairs: dict[str, str] = {}
    for p in inputs:
        given = base / Path(p).expanduser()
        shown = shown_path(given, base, redact)
        for form in (os.path.realpath(given), str(given), os.path.normpath(given), str(Path(given).absolute())):
            if os.path.isabs(form) and form != os.sep:
                pairs.setdefault(form, shown)
    return dict(sorted(pairs.items(), key=lambda kv: -len(kv[0])))


def redact_text(text: str, mapping: dict[str, str]) -> str:
    """Replace each absolute input path (raw, HTML-escaped or JSON-escaped) by its shown form, in one pass.

    A path is replaced only where it starts a path (not inside a longer one such as an
    already relative ``../x/...``) and ends one (``/data`` is not replaced in ``/data2``),
    so applying this twice changes nothing more.
    """
    if not mapping:
        return text
    pattern, forms = _redactor(tuple(mapping.items()))
    return pattern.sub(lambda m: forms[m.group(1)], text)


@functools.lru_cache(maxsize=8)
def _redactor(items: tuple[tuple[str, str], ...]) -> tuple[re.Pattern[str], dict[str, str]]:
    """The compiled pattern and replacements of one mapping (a notebook has thousands of strings to redact)."""
    forms: dict[str, str] = {}
    for raw, shown in items:
        forms.update({raw: shown, html.escape(raw): html.escape(shown), json.dumps(raw)[1:-1]: json.dumps(shown)[1:-1],
                      json.dumps(raw, ensure_ascii=False)[1:-1]: json.dumps(shown, ensure_ascii=False)[1:-1]})
    alternatives = "|".join(re.escape(k) for k in sorted(forms, key=len, reverse=True))
    return re.compile(r"(?<![\w./-])(" + alternatives + r")(?![\w.-])"), forms


def redact_obj(obj: Any, mapping: dict[str, str]) -> Any:
    """``redact_text`` on every string of a JSON-like object, keys included."""
    if isinstance(obj, str):
        return redact_text(obj, mapping)
    if isinstance(obj, dict):
        return {redact_obj(k, mapping) if isinstance(k, str) else k: redact_obj(v, mapping) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact_obj(v, mapping) for v in obj]
    return obj


def embed(doc: dict[str, Any]) -> str:
    """``doc`` as a JSON script element: '<', '>' and '&' written as \\u escapes, so no text can end it."""
    text = json.dumps({"schema": EMBED_SCHEMA, **doc}, sort_keys=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/json" id="{EMBED_ID}">{text}</script>'


def insert_embedded(page: str, doc: dict[str, Any]) -> str:
    """The page with ``embed(doc)`` placed just before ``</body>`` (at the end if there is none)."""
    block = embed(doc)
    at = page.rfind("</body>")
    return page + block if at < 0 else page[:at] + block + page[at:]


def read_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The result JSON embedded in a report page (``summary`` and ``provenance``), for scripts.

    Hostile pages included: a FIFO or device is refused without blocking, the size is bounded,
    the element is found in linear time (the last opening tag, as ``insert_embedded`` puts it
    last, then its first ``</script>``, which the escaped JSON cannot hold) and parsed with the
    nesting limit; every failure is one ``ForensicsError``.
    """
    p = Path(path)
    raw = read_regular(p, MAX_REPORT_BYTES, "report page")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ForensicsError(f"cannot read the report (not UTF-8 at byte {exc.start})", path=p) from None
    at = text.rfind(_EMBED_OPEN)
    if at < 0:
        raise ForensicsError(f"holds no embedded eagleforensics result (no script id={EMBED_ID})", path=p)
    end = text.find("</script>", at + len(_EMBED_OPEN))
    if end < 0:
        raise ForensicsError("embedded result is not closed (no </script>): the page is truncated", path=p)
    try:
        doc = parse_json(text[at + len(_EMBED_OPEN):end], p, "embedded result")
    except json.JSONDecodeError as exc:
        raise ForensicsError(f"embedded result is not valid JSON ({exc.msg})", path=p) from None
    if not isinstance(doc, dict) or doc.get("schema") != EMBED_SCHEMA:
        raise ForensicsError(f"embedded result is not of schema {EMBED_SCHEMA}", path=p)
    return doc
