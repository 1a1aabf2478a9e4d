"""The target's tokenizer and chat template, read from its directory: never downloaded, sizes bounded, templates sandboxed.

``load_tokenizer(DIR)`` reads ``tokenizer.json`` with the ``tokenizers`` library and the chat
template from ``chat_template.jinja``, ``chat_template.json`` or ``tokenizer_config.json`` (the
order transformers 5 loads them in). ``ChatTokenizer.render`` renders a conversation the way
transformers' ``apply_chat_template`` does (``chat_template_utils._compile_jinja_template``): a
jinja2 ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, loop
controls, ``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII characters,
the special-token strings as variables, and ``{% generation %}`` blocks rendered as their body.
Templates come from the model's files and are untrusted code, hence the sandbox (jinja2 >=
3.1.6, as transformers requires), bounded in time, size and steps (``io.chatrender``). Text is encoded without adding special tokens, as
``apply_chat_template(tokenize=True)`` does: the template writes them itself.

Each tokenizer file present is judged by ``os.stat`` before it is opened: a FIFO, a device or a dangling link
is one line, never skipped for another file. Every call into ``tokenizers`` runs guarded: a Rust panic (a
regex that gives up) is one line naming tokenizer.json, Rust's report kept off stderr.
"""
from __future__ import annotations

import json
import os
import stat
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

from ..errors import ForensicsError
from .guards import NOT_REGULAR, parse_json, read_regular
from .sizecheck import human_bytes

MAX_TOKENIZER_BYTES = 64 * 1024 * 1024  # Gemma 3's tokenizer.json is 33 MB, Qwen3's 11 MB
MAX_CONFIG_BYTES = 8 * 1024 * 1024  # tokenizer_config.json embeds the template and every added token
MAX_TEMPLATE_BYTES = 1024 * 1024  # the longest real chat templates are about 20 KB
SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json")
INSTALL_HINT = "pip install 'eagleforensics[audit]' (tokenizers and jinja2)"


def present(path: Path) -> bool:
    """Whether a tokenizer file is there: False when absent, True for a regular file, and one line for anything
    else (a FIFO would hang the read, /dev/zero never ends, a dangling link is a broken file): judged by
    ``os.stat`` before anything is opened, never silently skipped for another file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise ForensicsError("is a symbolic link to nothing: the tokenizer file is broken", path=path) from None
        return False
    except OSError as exc:
        raise ForensicsError(f"cannot be read: {exc.strerror or exc}", path=path) from None
    if stat.S_ISDIR(mode):
        raise ForensicsError("is a directory, expected a tokenizer file", path=path)
    if not stat.S_ISREG(mode):
        raise ForensicsError(NOT_REGULAR, path=path)
    return True


_QUIET = threading.RLock()


@contextmanager
def _rust_guard(path: Path, what: str) -> Iterator[None]:
    """Run a ``tokenizers`` call with Rust's panic report kept off stderr (its hook writes to descriptor 2, a
    backtrace of some 190 lines under RUST_BACKTRACE) and a panic (``pyo3_runtime.PanicException``, a
    BaseException) turned into one line naming ``path``."""
    with _QUIET:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):  # no descriptor 2 to quiet: still catch the panic
            saved = -1
        try:
            if saved >= 0:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 2)
                os.close(null)
            yield
        except BaseException as exc:
            if type(exc).__name__ != "PanicException":
                raise
            text = " ".join(str(exc).split())[:160] or "no message"
            raise ForensicsError(f"the tokenizers library failed {what} (a Rust panic: {text}); the tokenizer's "
                                 "regex or settings are broken", path=path) from None
        finally:
            if saved >= 0:
                os.dup2(saved, 2)
                os.close(saved)


class GuardedTokenizer:
    """A ``tokenizers.Tokenizer`` whose every call runs under ``_rust_guard`` (a panic is one line, not a crash)."""

    def __init__(self, tokenizer: Any, path: Path) -> None:
        self._tokenizer, self._path = tokenizer, path

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._tokenizer, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with _rust_guard(self._path, f"in {name}"):
                return attr(*args, **kwargs)
        return call


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config writes it: a string, or ``{"content": ...}`` (AddedToken)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _read_json(path: Path, limit: int, what: str) -> Any:
    raw = read_regular(path, limit, what)
    try:
        return parse_json(raw, path, what)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ForensicsError(f"{what} is not valid JSON ({' '.join(str(exc).split())[:120]})", path=path) from None


def _template_from(value: Any, path: Path) -> str | None:
    """A ``chat_template`` value: a string, or a list of ``{"name", "template"}`` (the ``default`` one is used)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default")
        if isinstance(chosen, str):
            return chosen
        raise ForensicsError(f"chat_template lists templates {sorted(str(n) for n in named)} but none named "
                             "'default'", path=path)
    raise ForensicsError(f"chat_template is a {type(value).__name__}, expected a string", path=path)


def _compile(template: str, path: Path) -> Any:
    """The template compiled in the bounded sandbox (``chatrender``), configured as transformers configures jinja2."""
    try:
        import jinja2
    except ImportError:
        raise ForensicsError(f"reading a chat template needs jinja2: {INSTALL_HINT}") from None
    from packaging.version import Version

    from .chatrender import compile_template

    if Version(jinja2.__version__) < Version("3.1.6"):
        raise ForensicsError(f"jinja2 {jinja2.__version__} has known sandbox escapes and chat templates are untrusted "
                             "code: pip install -U 'jinja2>=3.1.6'")
    try:
        return compile_template(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ForensicsError(f"chat template does not parse: {' '.join(str(exc).split())[:160]} (line {exc.lineno})",
                             path=path) from None
    except RecursionError:
        raise ForensicsError("chat template nests too deeply to parse", path=path) from None
    except (SyntaxError, MemoryError) as exc:  # jinja2 parsed it; Python refuses the code it compiles to
        why = exc.msg if isinstance(exc, SyntaxError) else "out of memory"
        raise ForensicsError(f"chat template nests its blocks deeper than Python can compile ({why}): no engine "
                             "can render it either", path=path) from None


@dataclass
class ChatTokenizer:
    """A target's tokenizer (``tokenizers.Tokenizer``), its special-token strings and its chat template (or None)."""

    path: Path
    tokenizer: Any
    chat_template: str | None
    specials: dict[str, str] = field(default_factory=dict)
    template_file: Path | None = None

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer can produce (added tokens included)."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` without added BOS/EOS (chat templates write their own)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Any) -> str:
        """The text of ``ids``, special tokens kept (they are what a skeleton is made of)."""
        return str(self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False))

    def token_id(self, text: str) -> int | None:
        """The id of ``text`` when it is a single token of the vocabulary, else None."""
        tid = self.tokenizer.token_to_id(text)
        return None if tid is None else int(tid)

    @cached_property
    def added_ids(self) -> frozenset[int]:
        """Ids of the added tokens (special or not): the template's control tokens live here."""
        decoder = self.tokenizer.get_added_tokens_decoder()
        return frozenset(int(i) for i in decoder)

    @cached_property
    def _compiled(self) -> Any:
        if self.chat_template is None:
            raise ForensicsError("has no chat template (no chat_template.jinja, chat_template.json or "
                                 "chat_template in tokenizer_config.json)", path=self.path)
        return _compile(self.chat_template, self.template_file or self.path)

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False, **kwargs: Any) -> str:
        """The text the chat template makes of ``messages`` (kwargs such as ``enable_thinking`` are passed on)."""
        from .chatrender import TemplateRefused, render_bounded

        context = {**self.specials, **kwargs}
        try:
            return render_bounded(self._compiled, messages=messages, add_generation_prompt=add_generation_prompt,
                                  tools=None, documents=None, **context)
        except TemplateRefused as exc:
            raise ForensicsError(f"chat template failed on a probe conversation: {exc}",
                                 path=self.template_file or self.path) from None


def has_tokenizer(directory: str | Path) -> bool:
    """True when ``directory`` holds a ``tokenizer.json`` (one that is there but no regular file is one line)."""
    return present(Path(directory) / "tokenizer.json")


def load_tokenizer(directory: str | Path) -> ChatTokenizer:
    """The tokenizer and chat template in ``directory`` (a target model's directory); bad input is one line."""
    d = Path(directory)
    tok_path = d / "tokenizer.json"
    for name in TOKENIZER_FILES[1:]:  # each one there is a regular file, used or not: none is skipped for another
        present(d / name)
    if not present(tok_path):
        raise ForensicsError("no tokenizer.json here (only fast tokenizers are read: save the target's tokenizer "
                             "with transformers to get one)", path=d)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ForensicsError(f"reading tokenizer.json needs the tokenizers library: {INSTALL_HINT}") from None
    raw = read_regular(tok_path, MAX_TOKENIZER_BYTES, "tokenizer.json")
    try:
        with _rust_guard(tok_path, "reading it"):
            tokenizer = GuardedTokenizer(Tokenizer.from_str(raw.decode("utf-8")), tok_path)
    except ForensicsError:
        raise
    except (UnicodeDecodeError, Exception) as exc:  # tokenizers raises its own Exception subclass
        raise ForensicsError(f"is not a tokenizer the tokenizers library can read "
                             f"({' '.join(str(exc).split())[:160]})", path=tok_path) from None
    cfg_path = d / "tokenizer_config.json"
    cfg = _read_json(cfg_path, MAX_CONFIG_BYTES, "tokenizer_config.json") if present(cfg_path) else {}
    if not isinstance(cfg, dict):
        raise ForensicsError("tokenizer_config.json is not a JSON object", path=cfg_path)
    specials = {k: t for k in SPECIAL_KEYS if (t := _token_text(cfg.get(k))) is not None}
    template, where = None, None
    jinja_path, json_path = d / "chat_template.jinja", d / "chat_template.json"
    if present(jinja_path):
        raw_t = read_regular(jinja_path, MAX_TEMPLATE_BYTES, "chat template")
        try:
            template, where = raw_t.decode("utf-8"), jinja_path
        except UnicodeDecodeError:
            raise ForensicsError("chat template is not UTF-8 text", path=jinja_path) from None
    elif present(json_path):
        obj = _read_json(json_path, MAX_CONFIG_BYTES, "chat_template.json")
        template = _template_from(obj.get("chat_template") if isinstance(obj, dict) else None, json_path)
        where = json_path
    else:
        template = _template_from(cfg.get("chat_template"), cfg_path)
        where = cfg_path if template is not None else None
    if template is not None and len(template.encode("utf-8")) > MAX_TEMPLATE_BYTES:
        raise ForensicsError(f"chat template is larger than {human_bytes(MAX_TEMPLATE_BYTES)}", path=where)
    return ChatTokenizer(d, tokenizer, template, specials, where)
