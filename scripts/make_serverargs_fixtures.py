"""Write SGLang arguments lines in the exact format each release prints, from the fields of its ServerArgs.

For the tests of ``engines.serverargs``: one log line per release range, made from the format, not
copied from anyone's log. The field names, their order and their literal defaults are read (with
``ast``, nothing imported or executed) from ``python/sglang/srt/server_args.py`` of an unpacked
wheel (``pip download --no-deps sglang==X``; 0.5.23 spreads them over
``arg_groups/fields/*.py``), a few are set to an EAGLE-3 launch, and the line is rendered the way
the release renders it: ``server_args=ServerArgs(k=v!r, ...)`` (dataclass repr, up to 0.5.18) or
``server_args={...}`` (dict repr of ``resolved_dict()``, 0.5.19 on), after SGLang's log prefix.

    python scripts/make_serverargs_fixtures.py [--wheels /work/wheels] [--out tests/fixtures/logs/serverargs]
"""
from __future__ import annotations

import argparse
import ast
from pathlib import Path

# release -> (format, file(s) holding the fields)
RELEASES = {
    "0.4.0": "repr", "0.4.3": "repr", "0.4.7": "repr", "0.4.10.post2": "repr", "0.5.5": "repr",
    "0.5.9": "repr", "0.5.13": "repr", "0.5.18": "repr", "0.5.19": "dict", "0.5.21": "dict", "0.5.23": "dict",
}
LAUNCH = {
    "model_path": "meta-llama/Llama-3.1-8B-Instruct",
    "tokenizer_path": "meta-llama/Llama-3.1-8B-Instruct",
    "speculative_algorithm": "EAGLE3",
    "speculative_draft_model_path": "/models/eagle3-llama3.1-8b",
    "speculative_num_steps": 5,
    "speculative_eagle_topk": 4,
    "speculative_num_draft_tokens": 8,
    "tp_size": 2,
    "context_length": 32768,
    "decode_log_interval": 25,
    "disable_cuda_graph": True,
    # values that stress a reader: quotes, an escaped newline, JSON inside a string
    "chat_template": "{% for m in messages %}'{{ m['content'] }}'\n{% endfor %}",
    "json_model_override_args": '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}',
}


def _default(node: ast.expr | None) -> object:
    """A field's default as a value: a literal, [] / {} for list/dict factories, else None."""
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        pass
    if isinstance(node, ast.Call):
        for kw in node.keywords:
            if kw.arg == "default":
                return _default(kw.value)
            if kw.arg == "default_factory" and isinstance(kw.value, ast.Name):
                return {"list": [], "dict": {}, "set": set()}.get(kw.value.id)
    return None


def _fields(path: Path, class_names: set[str] | None) -> dict[str, object]:
    """Annotated fields (name -> default) of the classes in ``path`` (all classes when None)."""
    out: dict[str, object] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and (class_names is None or node.name in class_names):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    name = item.target.id
                    if not name.startswith("_") and "ClassVar" not in ast.unparse(item.annotation):
                        out[name] = _default(item.value)
    return out


def release_fields(wheels: Path, version: str) -> dict[str, object]:
    """The ServerArgs fields of one unpacked release, in declaration order."""
    root = wheels / f"sglang-{version}" / "sglang" / "srt"
    fields = _fields(root / "server_args.py", {"ServerArgs"})
    if not fields:  # 0.5.23: namespaces under arg_groups/fields
        for path in sorted((root / "arg_groups" / "fields").glob("*.py")):
            fields.update(_fields(path, None))
    return fields


def line(version: str, fmt: str, fields: dict[str, object]) -> str:
    """The log line the release prints for these fields (SGLang prefix, then its repr)."""
    values = {k: (LAUNCH[k] if k in LAUNCH else v) for k, v in fields.items()}
    if version == "0.4.3":  # EAGLE3 arrived in 0.4.6; 0.4.3 accepts EAGLE only
        values["speculative_algorithm"] = "EAGLE"
    body = ("ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in values.items()) + ")") if fmt == "repr" else repr(values)
    return f"[2026-11-29 10:00:00] server_args={body}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", type=Path, default=Path("/work/wheels"))
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests/fixtures/logs/serverargs")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for version, fmt in RELEASES.items():
        fields = release_fields(args.wheels, version)
        where = "entrypoints/engine.py" if version != "0.4.0" else "server.py"
        text = (f"# format made from sgl-project/sglang {version} python/sglang/srt/{where} (the server_args log "
                f"line) with the {len(fields)} ServerArgs fields and literal defaults of that release "
                "(scripts/make_serverargs_fixtures.py)\n" + line(version, fmt, fields) + "\n")
        (args.out / f"sglang_{version}_args.log").write_text(text)
        print(f"sglang {version}: {len(fields)} fields, {len(text)} bytes")


if __name__ == "__main__":
    main()
