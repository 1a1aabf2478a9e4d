"""Notebook reports: papermill -> nbconvert to one offline HTML file, and the align report's parameters.

``render`` is the one pipeline every report uses (align here, runs in ``runs_report``): it runs a
notebook with papermill (kernel ``python3`` = this interpreter's ipykernel, whatever other
python3 kernel is installed) and converts the executed notebook with nbconvert into a single
self-contained HTML file: plotly.js inline, no CDN script, no require.js/MathJax/mermaid/widget
loaders from the web. Each report validates its parameters before any kernel starts.

How a notebook records its result (the "glue"): one display output carries
``{"eagleforensics": <summary>}`` in its output *metadata* (nbformat's standard per-output
metadata, which every notebook tool keeps and no HTML exporter renders). Every summary names
its schema, and ``read_summary`` finds the one of the schema asked for. The align summary is
``AlignmentResult.to_dict()`` plus the parameters; every summary has ``verdict`` and ``exit_code``.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from ..engines.crosscheck import check_request
from ..engines.rules import ENGINES as SERVING_ENGINES
from ..errors import ForensicsError
from ..io.atomic import is_fixable, write_bytes_atomic, write_error
from ..io.guards import check_not_input, check_output_target
from .kernel import INSTALL_HINT, WorkFolder, kernel_manager_class, work_folder

if TYPE_CHECKING:  # pragma: no cover
    from ..io.capture import Capture
    from ..io.training import TrainingRecord
    from ..results import AlignmentResult

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
SAMPLES_DIR = Path(__file__).resolve().parents[2] / "data_samples"
SUMMARY_KEY = "eagleforensics"
SUMMARY_SCHEMA = "eagleforensics-notebook-summary-v1"
KERNEL_NAME = "python3"
DEVICES = ("auto", "cpu", "cuda")  # where the scoring runs, as align --device
CONVENTIONS = ("hf", "vllm", "sglang", "trtllm")  # keys of capture.CONVENTIONS (kept here: no torch import)
ENGINES = tuple(SERVING_ENGINES)  # the engines align() can check serving for (align --engine)
STRICT_ERROR = "VerdictNotOK"  # what a strict notebook's last cell raises (nbview.strict_check)
# cells never shown in a page: parameters, the strict check, papermill's own error banners
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colour codes in tracebacks
# One notebook cell may run this long before the report stops it (a hang must end, issue 31): half an hour,
# generous for a cell on large inputs; EAGLEFORENSICS_CELL_TIMEOUT sets another limit.
CELL_TIMEOUT_ENV = "EAGLEFORENSICS_CELL_TIMEOUT"
DEFAULT_CELL_TIMEOUT = 1800.0
START_TIMEOUT = 120  # seconds for the kernel to start and answer
HIDDEN_TAGS = {"parameters", "injected-parameters", "ef-strict", "papermill-error-cell-tag"}



@dataclass(frozen=True)
class ReportParams:
    """The notebook parameters after validation: absolute paths, checked types and choices."""

    shard: str
    capture: str
    capture_convention: str = "hf"
    engine: str | None = None
    max_tokens: int | None = None
    device: str = "auto"
    title: str | None = None
    draft_config: str | None = None
    engine_version: str | None = None
    model_type: str | None = None
    drafter: str | None = None  # EAGLE-3 drafter directory: adds the Replay section (the replay pipeline, eagleforensics/replay.py)
    target: str | None = None  # target model directory for the replay (lm_head, embedding)
    strict: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def heading(self) -> str:
        """The report's title: the given one, else ``<shard> vs <capture>``."""
        return self.title or f"Alignment: {Path(self.shard).name} vs {Path(self.capture).name}"


@dataclass(frozen=True)
class ReportOutcome:
    """What a report wrote and what its notebook recorded; ``exit_code`` is the summary's (the alignment's)."""

    html: Path
    notebook: Path | None
    summary: dict[str, Any]

    @property
    def exit_code(self) -> int:
        return int(self.summary["exit_code"])

    @property
    def verdict(self) -> str:
        return str(self.summary["verdict"])


class NotebookFailed(ForensicsError):
    """The notebook raised something other than a ForensicsError: a bug, not bad input (exit 3)."""

    exit_code = 3


def sample_inputs() -> tuple[str, str]:
    """The bundled demo pair (data_samples/record_layer_outputs.pt, capture.pt) of a source checkout."""
    shard, capture = SAMPLES_DIR / "record_layer_outputs.pt", SAMPLES_DIR / "capture.pt"
    if not (shard.is_file() and capture.is_file()):
        raise ForensicsError("shard and capture are required (no data_samples/ next to this installation)")
    return str(shard), str(capture)


def input_path(value: Any, name: str, want_file: bool) -> str:
    """An existing, readable, non-empty input as an absolute path; ``name`` is the parameter it came from."""
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ForensicsError(f"parameter {name} must be a path (a string), got {type(value).__name__} {value!r}")
    p = Path(value).expanduser()
    if not p.exists():
        raise ForensicsError(f"no such file or directory (parameter {name})", path=p)
    if want_file and not p.is_file():
        raise ForensicsError(f"is not a regular file (parameter {name})", path=p)
    if p.is_file() and p.stat().st_size == 0:
        raise ForensicsError(f"is empty (parameter {name})", path=p)
    if not os.access(p, os.R_OK):
        raise ForensicsError(f"is not readable (parameter {name})", path=p)
    return str(p.resolve())


def _choice(value: Any, name: str, choices: tuple[str, ...], optional: bool = False) -> Any:
    if optional and value is None:
        return None
    if not isinstance(value, str) or value not in choices:
        raise ForensicsError(f"parameter {name} must be one of {', '.join(choices)}"
                             f"{' or None' if optional else ''}, got {value!r}")
    return value


def _optional_text(value: Any, name: str, example: str) -> str | None:
    """None, or a non-empty string (a number such as papermill's ``-p engine_version 0.5`` becomes its text)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise ForensicsError(f"parameter {name} must be a string such as {example!r} or None, "
                             f"got {type(value).__name__} {value!r}")
    return value.strip()


def _serving_params(engine: str | None, draft_config: Any, engine_version: Any, model_type: Any
                    ) -> tuple[str | None, str | None, str | None]:
    """The serving-check parameters, checked as ``align --engine`` checks them; they all need an engine."""
    version = _optional_text(engine_version, "engine_version", "0.5.12")
    mtype = _optional_text(model_type, "model_type", "llama")
    if engine is None:
        given = [n for n, v in (("draft_config", draft_config), ("engine_version", version), ("model_type", mtype))
                 if v is not None]
        if given:
            raise ForensicsError(f"parameter {', '.join(given)} needs engine (one of {', '.join(ENGINES)}): "
                                 "the engine whose reading of the draft config to check")
        return None, None, None
    config = None if draft_config is None else input_path(draft_config, "draft_config", want_file=False)
    check_request(config, engine, version, mtype)  # version syntax, SGLang model type
    return config, version, mtype


def validate_params(shard: Any = None, capture: Any = None, capture_convention: Any = "hf", engine: Any = None,
                    max_tokens: Any = None, device: Any = "auto", title: Any = None, *, draft_config: Any = None,
                    engine_version: Any = None, model_type: Any = None, drafter: Any = None,
                    target: Any = None, strict: Any = False) -> ReportParams:
    """Check every notebook parameter before any tensor is read; a bad one is a one-line ForensicsError.

    ``shard`` and ``capture`` both None selects the bundled demo pair. ``engine`` turns on the
    serving check (as ``align --engine``): what that engine captures for ``draft_config`` (its
    default when None), read with the rule of ``engine_version`` and ``model_type``. ``device``
    is where the scoring runs (auto, cpu, cuda, cuda:N: as ``align --device``). ``strict`` makes
    the notebook's last cell fail with the verdict line when the verdict is not OK.
    """
    if shard is None and capture is None:
        shard, capture = sample_inputs()
    if shard is None or capture is None:
        raise ForensicsError(f"parameter {'shard' if shard is None else 'capture'} is required")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ForensicsError(f"parameter max_tokens must be a whole number >= 1 or None, got {max_tokens!r}")
    if isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit():
        device_ok = device  # one GPU by index, as align --device accepts
    else:
        device_ok = _choice(device, "device", DEVICES)
    if not isinstance(strict, bool):
        raise ForensicsError(f"parameter strict must be True or False, got {type(strict).__name__} {strict!r}")
    if title is not None and not isinstance(title, str):
        raise ForensicsError(f"parameter title must be a string or None, got {type(title).__name__} {title!r}")
    engine = _choice(engine, "engine", ENGINES, True)
    serving = _serving_params(engine, draft_config, engine_version, model_type)
    if target is not None and drafter is None:
        raise ForensicsError("parameter target needs drafter: the target's tensors are read for the drafter replay")
    replay = [None if v is None else input_path(v, n, want_file=False) for n, v in (("drafter", drafter), ("target", target))]
    return ReportParams(
        input_path(shard, "shard", want_file=True), input_path(capture, "capture", want_file=False),
        _choice(capture_convention, "capture_convention", CONVENTIONS), engine,
        max_tokens, device_ok, title, *serving, *replay, strict,
    )


def run_alignment(params: ReportParams) -> tuple[AlignmentResult, TrainingRecord, Capture]:
    """Load both inputs once and align them (with the serving check when an engine is given)."""
    from ..alignment import align
    from ..io.capture import load_capture
    from ..io.training import load_training

    record = load_training(params.shard)
    capture = load_capture(params.capture, convention=params.capture_convention)
    result = align(record, capture, max_tokens=params.max_tokens, draft_config=params.draft_config,
                   engine=params.engine, engine_version=params.engine_version, model_type=params.model_type,
                   device=params.device)
    return result, record, capture


def notebook_summary(result: AlignmentResult, params: ReportParams | None = None) -> dict[str, Any]:
    """What the align notebook records for tests and the CLI: the result's dict, the parameters, a schema name."""
    return {"schema": SUMMARY_SCHEMA, **result.to_dict(), "parameters": None if params is None else params.as_dict()}


def read_summary(nb: Any, schema: str = SUMMARY_SCHEMA) -> dict[str, Any]:
    """The summary of ``schema`` an executed notebook recorded (see the module docstring), from a path or a notebook."""
    if isinstance(nb, (str, os.PathLike)):
        import nbformat

        nb = nbformat.read(str(nb), as_version=4)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            found = out.get("metadata", {}).get(SUMMARY_KEY)
            if isinstance(found, dict) and found.get("schema") == schema:
                return dict(found)
    raise NotebookFailed(f"the executed notebook recorded no summary of schema {schema} (did its verdict cell run?)")


def find_notebook(name: str = "align.ipynb") -> Path:
    """A notebook of this source checkout's ``notebooks/`` folder."""
    p = NOTEBOOK_DIR / name
    if not p.is_file():
        raise ForensicsError(f"notebook {name} not found in {NOTEBOOK_DIR} (the report runs from a source checkout)")
    return p


def safe_stem(text: str, fallback: str) -> str:
    """A file-name-safe stem: anything but letters, digits, '.', '_' and '-' becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")[:80] or fallback


def default_output(params: ReportParams, cwd: Path | None = None) -> Path:
    """``reports/align-<shard stem>.html`` under the current directory: never beside the inputs."""
    return (cwd or Path.cwd()) / "reports" / f"align-{safe_stem(Path(params.shard).stem, 'record')}.html"


def cell_timeout() -> float:
    """Seconds one notebook cell may run: ``EAGLEFORENSICS_CELL_TIMEOUT``, else ``DEFAULT_CELL_TIMEOUT``."""
    raw = os.environ.get(CELL_TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw.strip() else DEFAULT_CELL_TIMEOUT
    except ValueError:
        raise ForensicsError(f"{CELL_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise ForensicsError(f"{CELL_TIMEOUT_ENV}={raw!r} is not a positive number of seconds")
    return value


def execute(notebook: Path, out: Path, parameters: dict[str, Any], cwd: Path, *,
            folder: WorkFolder | None = None) -> Any:
    """Run ``notebook`` with papermill (report mode) into ``out``; errors in it become ForensicsError/NotebookFailed.

    With ``folder`` (the run's ``kernel.work_folder``) the kernel's connection file and log are
    kept in it and the kernel is recorded there, so every way out of the run stops it.
    """
    try:
        import papermill
        from nbclient.exceptions import DeadKernelError
        from papermill.exceptions import PapermillExecutionError
    except ImportError:
        raise ForensicsError(f"the report needs papermill; {INSTALL_HINT}") from None
    from nbclient.exceptions import CellTimeoutError

    limit = cell_timeout()
    try:
        return papermill.execute_notebook(
            str(notebook), str(out), parameters=parameters, kernel_name=KERNEL_NAME, report_mode=True,
            progress_bar=False, cwd=str(cwd), kernel_manager_class=kernel_manager_class(folder),
            execution_timeout=limit, start_timeout=START_TIMEOUT,
        )
    except CellTimeoutError:
        raise NotebookFailed(f"{notebook.name}: a cell ran longer than {limit:g} s and was stopped (a hang, or a "
                             f"larger input than the limit allows: set {CELL_TIMEOUT_ENV} to more seconds)") from None
    except DeadKernelError:
        why = folder.kernel_log_tail() if folder is not None else ""
        raise NotebookFailed(f"{notebook.name}: the kernel died (out of memory or killed)"
                             f"{': ' + why if why else ''}") from None
    except PapermillExecutionError as exc:
        if exc.ename == STRICT_ERROR and out.exists():  # strict: the verdict is not OK; the page is still wanted
            import nbformat

            return nbformat.read(str(out), as_version=4)
        if exc.ename == "ForensicsError":
            raise ForensicsError(str(exc.evalue)) from None
        raise NotebookFailed(f"{notebook.name} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}") from None


def to_html(nb: Any, with_input: bool = False) -> str:
    """One self-contained HTML page of an executed notebook; parameter cells are always left out."""
    try:
        from nbconvert.preprocessors import TagRemovePreprocessor

        from .exporter import OfflineHTMLExporter
    except ImportError:
        raise ForensicsError(f"the report needs nbconvert; {INSTALL_HINT}") from None
    exporter = OfflineHTMLExporter(exclude_input=not with_input, exclude_input_prompt=True,
                                   exclude_output_prompt=True)
    exporter.register_preprocessor(
        TagRemovePreprocessor(remove_cell_tags=HIDDEN_TAGS, enabled=True), enabled=True)
    body, _ = exporter.from_notebook_node(nb)
    return body


def insert_provenance(page: str, record: dict[str, Any], summary: dict[str, Any]) -> str:
    """The page with a visible provenance block at the end of its main part and the result JSON embedded."""
    from . import provenance as prov
    from .plots import esc

    rows = [("created (UTC)", record["created"]),
            ("versions", ", ".join(f"{k} {v}" for k, v in record["versions"].items())),
            ("command", record["command"] or "-"), ("paths", record["paths"])]
    rows += [(f"{i['role']}", f"{i['path']}: {i['bytes']:,} bytes" + (f" in {i['files']} files" if i["files"] != 1 else "")
              + f", {i['hash'] or 'not hashed (--no-hash)'}") for i in record["inputs"]]
    body = "".join(f"<tr><th style='text-align:left;padding-right:1em;vertical-align:top'>{esc(k)}</th>"
                   f"<td style='text-align:left;white-space:normal;word-break:break-all'>{esc(v)}</td></tr>"
                   for k, v in rows)
    block = (f"<section class='ef-provenance' style='margin:2em 1em;font-size:0.9em'><h2>Provenance</h2>"
             f"<p>The result is embedded in this page as JSON (<code>{prov.EMBED_ID}</code>; read it with "
             f"<code>eagleforensics.report.provenance.read_report</code>).</p><table>{body}</table></section>")
    at = page.rfind("</main>")
    at = at if at >= 0 else page.rfind("</body>")
    page = page + block if at < 0 else page[:at] + block + page[at:]
    return prov.insert_embedded(page, {"summary": summary, "provenance": record})


def render(notebook: Path, parameters: dict[str, Any], html_path: Path, *, schema: str, heading: str,
           inputs: Iterable[str] = (), with_input: bool = False, keep_notebook: bool = False,
           roles: Iterable[tuple[str, str]] | None = None, command: list[str] | None = None,
           hash_inputs: bool = True, redact_paths: bool = False) -> ReportOutcome:
    """Execute ``notebook`` with validated ``parameters``, read its ``schema`` summary, write one offline HTML file.

    The executed notebook is written beside the HTML (``.ipynb``) only if kept, or as
    ``.failed.ipynb`` when the notebook crashed. Neither may overwrite one of ``inputs``.
    The page ends with a provenance block (``provenance.collect``: inputs named by ``roles``
    with size and hash unless ``hash_inputs`` is off, versions, ``command``) and the summary
    and provenance embedded as JSON; input paths are shown relative to the working
    directory, or by name only with ``redact_paths``.
    """
    from . import provenance as prov

    html_path = Path(html_path).expanduser().resolve()
    inputs = list(inputs)
    named = list(roles) if roles is not None else [("input", p) for p in inputs]
    # every form of every path: the inputs (resolved, as the notebook gets them) and the words of the
    # command line that name files (as the user typed them: ../dir/file, a symlinked folder)
    mapping = prov.path_map([p for _, p in named] + inputs + [html_path] + prov.command_paths(command),
                            redact=redact_paths)
    record = prov.collect(named, command=command, parameters=parameters, notebook=f"notebooks/{notebook.name}",
                          hash_files=hash_inputs, redact=redact_paths)
    record = prov.redact_obj(record, mapping)
    if html_path.is_dir():
        raise ForensicsError("is a directory; give the report file name (e.g. reports/report.html)", path=html_path)
    executed_path = html_path.with_suffix(".ipynb")
    failed_path = html_path.with_suffix(".failed.ipynb")
    inputs = list(inputs)
    for p in (html_path, executed_path, failed_path):  # by device+inode, and never inside an input directory
        check_not_input(p, inputs, "report")
        check_output_target(p, "report")  # never a device or pipe: checked before the kernel starts
    try:
        with work_folder() as folder:  # removed on every way out, with the kernel's connection file and sockets
            work = folder.path / f"{notebook.stem}.executed.ipynb"
            try:
                nb = execute(notebook, work, parameters, cwd=folder.path, folder=folder)
            except NotebookFailed as exc:
                if not work.exists():
                    raise
                write_bytes_atomic(failed_path, _notebook_bytes(work, mapping, redact_paths, failed_path))
                raise NotebookFailed(f"{exc.detail} (executed notebook kept at {failed_path})") from None
            summary = read_summary(nb, schema)
            nb.metadata["title"] = heading
            page = prov.redact_text(to_html(nb, with_input), mapping)
            page = insert_provenance(page, record, prov.redact_obj(summary, mapping)).encode("utf-8")
            if keep_notebook:
                write_bytes_atomic(executed_path, _notebook_bytes(work, mapping, redact_paths, executed_path))
            write_bytes_atomic(html_path, page)  # a failed write leaves the previous report as it was
    except OSError as exc:  # the work folder lives in the temporary directory: full, or not writable
        if not is_fixable(exc):
            raise
        import tempfile

        raise write_error(exc, tempfile.gettempdir(), "the report runs its notebook in a work folder in the "
                          "temporary directory: free space there or point TMPDIR at another folder") from None
    return ReportOutcome(html_path, executed_path if keep_notebook else None, summary)


def _notebook_bytes(work: Path, mapping: dict[str, str], redact: bool, dest: Path) -> bytes:
    """The executed notebook as written beside the report: with ``redact``, every input path in it (cells,
    outputs, papermill's metadata) shown as the page shows it, the work folder as ``.``, this checkout and the
    home directory by name."""
    data = work.read_bytes()
    if not redact:
        return data
    import json

    from . import provenance as prov

    nb = json.loads(data)
    for cell in nb.get("cells", []):  # colour codes glue a path to the code before it ("\x1b[32m/home/...")
        for out in cell.get("outputs", []):
            if isinstance(out.get("traceback"), list):
                out["traceback"] = [_ANSI.sub("", str(line)) for line in out["traceback"]]
            if isinstance(out.get("text"), str):
                out["text"] = _ANSI.sub("", out["text"])
    papermill = nb.get("metadata", {}).get("papermill")
    if isinstance(papermill, dict):  # where the template and the work copy were: directories of this machine
        papermill["input_path"] = f"notebooks/{Path(str(papermill.get('input_path') or 'notebook.ipynb')).name}"
        papermill["output_path"] = dest.name
        papermill["cwd"] = "."
    # beyond the inputs: the work folder, this checkout (tracebacks name its files) and the home directory
    forms = {**mapping, str(work.parent): ".", str(work.parent.resolve()): ".", str(NOTEBOOK_DIR): "notebooks",
             str(NOTEBOOK_DIR.parent): "eagleforensics", str(Path.home()): "~"}
    return (json.dumps(prov.redact_obj(nb, forms), indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def build_report(shard: Any, capture: Any, out: str | Path | None = None, *, capture_convention: str = "hf",
                 engine: str | None = None, max_tokens: int | None = None, device: str = "auto",
                 title: str | None = None, draft_config: str | Path | None = None,
                 engine_version: str | None = None, model_type: str | None = None, with_input: bool = False,
                 keep_notebook: bool = False, notebook: str | Path | None = None, strict: bool = True,
                 hash_inputs: bool = True, redact_paths: bool = False, command: list[str] | None = None,
                 drafter: str | Path | None = None, target: str | Path | None = None) -> ReportOutcome:
    """Validate, execute the align notebook, write one HTML file; the executed notebook goes beside it if kept.

    ``strict`` (on here, off in JupyterLab) makes the notebook itself fail on a verdict that is
    not OK; the page is written either way and the exit code is the verdict's. ``drafter`` (and
    ``target``) add the replay section.
    """
    params = validate_params(shard, capture, capture_convention, engine, max_tokens, device, title,
                             draft_config=draft_config, engine_version=engine_version, model_type=model_type,
                             drafter=drafter, target=target, strict=strict)
    html_path = Path(out) if out is not None else default_output(params)
    source = Path(notebook) if notebook is not None else find_notebook()
    inputs = [x for x in (params.shard, params.capture, params.draft_config, params.drafter, params.target)
              if x is not None]
    roles = [("training record", params.shard), ("capture", params.capture)]
    roles += [(name, value) for name, value in (("draft config", params.draft_config), ("drafter", params.drafter),
                                                ("target", params.target)) if value is not None]
    return render(source, params.as_dict(), html_path, schema=SUMMARY_SCHEMA, heading=params.heading,
                  inputs=inputs, with_input=with_input, keep_notebook=keep_notebook, roles=roles, command=command,
                  hash_inputs=hash_inputs, redact_paths=redact_paths)
