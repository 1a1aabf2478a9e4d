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
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import ForensicsError
from .guards import parse_json, read_regular
from .sizecheck import human_bytes

MAX_TOKENIZER_BYTES = 64 * 1024 * 1024  # Gemma 3's tokenizer.json is 33 MB, Qwen3's 11 MB
MAX_CONFIG_BYTES = 8 * 1024 * 1024  # tokenizer_config.json embeds the template and every added token
MAX_TEMPLATE_BYTES = 1024 * 1024  # the longest real chat templates are about 20 KB
SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json")
INSTALL_HINT = "pip install 'eagleforensics[audit]' (tokenizers and jinja2)"


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
    """True when ``directory`` holds a ``tokenizer.json``."""
    return (Path(directory) / "tokenizer.json").is_file()


def load_tokenizer(directory: str | Path) -> ChatTokenizer:
    """The tokenizer and chat template in ``directory`` (a target model's directory); bad input is one line."""
    d = Path(directory)
    tok_path = d / "tokenizer.json"
    if not tok_path.exists():
        raise ForensicsError("no tokenizer.json here (only fast tokenizers are read: save the target's tokenizer "
                             "with transformers to get one)", path=d)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ForensicsError(f"reading tokenizer.json needs the tokenizers library: {INSTALL_HINT}") from None
    raw = read_regular(tok_path, MAX_TOKENIZER_BYTES, "tokenizer.json")
    try:
        tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    except (UnicodeDecodeError, Exception) as exc:  # tokenizers raises its own Exception subclass
        raise ForensicsError(f"is not a tokenizer the tokenizers library can read "
                             f"({' '.join(str(exc).split())[:160]})", path=tok_path) from None
    cfg_path = d / "tokenizer_config.json"
    cfg = _read_json(cfg_path, MAX_CONFIG_BYTES, "tokenizer_config.json") if cfg_path.is_file() else {}
    if not isinstance(cfg, dict):
        raise ForensicsError("tokenizer_config.json is not a JSON object", path=cfg_path)
    specials = {k: t for k in SPECIAL_KEYS if (t := _token_text(cfg.get(k))) is not None}
    template, where = None, None
    jinja_path, json_path = d / "chat_template.jinja", d / "chat_template.json"
    if jinja_path.is_file():
        raw_t = read_regular(jinja_path, MAX_TEMPLATE_BYTES, "chat template")
        try:
            template, where = raw_t.decode("utf-8"), jinja_path
        except UnicodeDecodeError:
            raise ForensicsError("chat template is not UTF-8 text", path=jinja_path) from None
    elif json_path.is_file():
        obj = _read_json(json_path, MAX_CONFIG_BYTES, "chat_template.json")
        template = _template_from(obj.get("chat_template") if isinstance(obj, dict) else None, json_path)
        where = json_path
    else:
        template = _template_from(cfg.get("chat_template"), cfg_path)
        where = cfg_path if template is not None else None
    if template is not None and len(template.encode("utf-8")) > MAX_TEMPLATE_BYTES:
        raise ForensicsError(f"chat template is larger than {human_bytes(MAX_TEMPLATE_BYTES)}", path=where)
    return ChatTokenizer(d, tokenizer, template, specials, where)
