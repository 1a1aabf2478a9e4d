"""Read Python ``repr`` text (a dict, a dataclass or Namespace repr) into plain values, without eval.

Server logs print their launch arguments as ``repr``: SGLang ``ServerArgs(model_path='m', ...)`` or
``{'model_path': 'm', ...}``, vLLM ``{'speculative_config': {'method': 'eagle3'}}`` or
``Namespace(model='m', ...)``. A log line is untrusted text, so this is a small tokenizer with
bounds, not ``eval``: strings, numbers, ``None``/``True``/``False``, dicts, lists, tuples, sets,
calls ``Name(k=v, ...)``, opaque reprs ``<Foo.BAR: 'x'>`` and bare words (``torch.bfloat16``).

* A call becomes a dict: its keyword arguments plus ``"__call__": "Name"`` (and ``"__args__"``
  for positional ones); an opaque ``<...>`` repr and a bare word stay strings.
* Bounded: nesting deeper than ``MAX_DEPTH``, more than ``MAX_VALUES`` values or text longer than
  ``MAX_TEXT`` characters raise ``ReprError``; so does anything unbalanced or unknown. Every
  step consumes input, so the reader never loops, and no regular expression backtracks.
"""
from __future__ import annotations

import ast
import re
from typing import Any

MAX_DEPTH = 48
MAX_VALUES = 200_000
MAX_TEXT = 4 * 1024 * 1024
CALL_KEY = "__call__"
ARGS_KEY = "__args__"

_WS = re.compile(r"\s*")
_STRING = re.compile(r"""[bBrRuU]{0,2}(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")""")
_NUMBER = re.compile(r"[-+]?(?:(?:\d[\d_]*)?\.\d+(?:[eE][-+]?\d+)?|\d[\d_]*\.?(?:[eE][-+]?\d+)?|inf|nan)"
                     r"(?![\w.])")
_NAME = re.compile(r"[A-Za-z_][\w.]*")
_BARE = re.compile(r"[^\s,()\[\]{}:=<>'\"]+")
_CONSTS = {"None": None, "True": True, "False": False}
_CUT = re.compile(r",\s*[A-Za-z_]\w*=")
_INT = re.compile(r"[-+]?\d+")
_KEY = re.compile(r"[A-Za-z_]\w*")


class ReprError(ValueError):
    """The text is not a repr this reader accepts (unbalanced, too deep, too large, unknown token)."""


class _Reader:
    """One pass over ``text``; ``value()`` reads one value at ``pos`` and moves past it."""

    def __init__(self, text: str) -> None:
        if len(text) > MAX_TEXT:
            raise ReprError(f"text longer than {MAX_TEXT} characters")
        self.text, self.pos, self.count = text, 0, 0

    def fail(self, what: str) -> ReprError:
        near = self.text[self.pos:self.pos + 20]
        return ReprError(f"{what} at character {self.pos} (near {near!r})")

    def skip(self) -> None:
        self.pos = _WS.match(self.text, self.pos).end()

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise self.fail(f"expected {char!r}")
        self.pos += 1

    def value(self, depth: int = 0) -> Any:
        """The value at the current position (after white space)."""
        if depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH}")
        self.count += 1
        if self.count > MAX_VALUES:
            raise self.fail(f"more than {MAX_VALUES} values")
        c = self.peek()
        if not c:
            raise self.fail("unexpected end of text")
        if c in "'\"" or (c in "bBrRuU" and _STRING.match(self.text, self.pos)):
            return self._string()
        if c == "{":
            return self._brace(depth)
        if c == "[":
            self.pos += 1
            return self._items("]", depth)
        if c == "(":
            self.pos += 1
            return tuple(self._items(")", depth))
        if c == "<":
            return self._opaque()
        m = _NUMBER.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            token = m.group(0).replace("_", "")
            if _INT.fullmatch(token):
                return int(token) if len(token) < 400 else float(token)
            return float(token)
        m = _NAME.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            name = m.group(0)
            if self.peek() == "(":
                self.pos += 1
                return self._call(name, depth)
            return _CONSTS[name] if name in _CONSTS else name
        m = _BARE.match(self.text, self.pos)
        if m and m.end() > self.pos:
            self.pos = m.end()
            return m.group(0)
        raise self.fail("unexpected character")

    def _string(self) -> str:
        m = _STRING.match(self.text, self.pos)
        if not m:
            raise self.fail("unterminated string")
        self.pos = m.end()
        token = m.group(0)
        quote = token.index(token[-1])
        prefix, body = token[:quote].lower(), token[quote + 1:-1]
        if "\\" not in body or "r" in prefix:
            return body
        try:
            out = ast.literal_eval(token)  # a single string literal: nothing to execute
        except (ValueError, SyntaxError, MemoryError):
            raise self.fail("bad string escape") from None
        return out.decode("utf-8", "replace") if isinstance(out, bytes) else str(out)

    def _opaque(self) -> str:
        """``<...>`` kept as text; nested ``<>`` and quoted parts are skipped over."""
        start, level = self.pos, 0
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in "'\"":
                m = _STRING.match(self.text, self.pos)
                self.pos = m.end() if m else self.pos + 1
                continue
            if c == "<":
                level += 1
                if level > MAX_DEPTH:
                    raise self.fail(f"nested deeper than {MAX_DEPTH}")
            elif c == ">":
                level -= 1
                if level == 0:
                    self.pos += 1
                    return self.text[start:self.pos]
            self.pos += 1
        raise self.fail("unterminated '<'")

    def _items(self, close: str, depth: int) -> list:
        out: list = []
        while True:
            if self.peek() == close:
                self.pos += 1
                return out
            out.append(self.value(depth + 1))
            c = self.peek()
            if c == ",":
                self.pos += 1
            elif c != close:
                raise self.fail(f"expected ',' or {close!r}")

    def _brace(self, depth: int) -> dict | frozenset:
        self.expect("{")
        if self.peek() == "}":
            self.pos += 1
            return {}
        first = self.value(depth + 1)
        if self.peek() != ":":  # a set
            items = [first]
            if self.peek() == ",":
                self.pos += 1
                items += self._items("}", depth)
            else:
                self.expect("}")
            return frozenset(_hashable(i) for i in items)
        out: dict = {}
        key = first
        while True:
            self.expect(":")
            out[_hashable(key)] = self.value(depth + 1)
            c = self.peek()
            if c == ",":
                self.pos += 1
                if self.peek() == "}":
                    self.pos += 1
                    return out
                key = self.value(depth + 1)
            elif c == "}":
                self.pos += 1
                return out
            else:
                raise self.fail("expected ',' or '}'")

    def _call(self, name: str, depth: int) -> dict:
        out: dict = {CALL_KEY: name}
        args: list = []
        while True:
            if self.peek() == ")":
                self.pos += 1
                break
            m = _NAME.match(self.text, self.pos)
            after = _WS.match(self.text, m.end()).end() if m else self.pos
            if m and after < len(self.text) and self.text[after] == "=" and self.text[after:after + 2] != "==":
                self.pos = after + 1
                out[m.group(0)] = self.value(depth + 1)
            else:
                args.append(self.value(depth + 1))
            c = self.peek()
            if c == ",":
                self.pos += 1
            elif c != ")":
                raise self.fail("expected ',' or ')'")
        if args:
            out[ARGS_KEY] = args
        return out


def _hashable(value: Any) -> Any:
    """A dict key or set member: lists and dicts become their text (reprs never use them as keys)."""
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def parse_repr(text: str) -> Any:
    """The one value ``text`` holds (trailing white space allowed); ReprError when it is not one."""
    reader = _Reader(text)
    out = reader.value()
    reader.skip()
    if reader.pos != len(text):
        raise reader.fail("text after the value")
    return out


def parse_prefix(text: str) -> tuple[Any, int]:
    """The first value of ``text`` and where it ends; what follows is left to the caller."""
    reader = _Reader(text)
    out = reader.value()
    return out, reader.pos


def split_assignments(text: str, limit: int = MAX_VALUES) -> list[tuple[str, str]]:
    """``a=1, b=x/y, c=Foo(d=2)`` -> ``[("a", "1"), ("b", "x/y"), ("c", "Foo(d=2)")]``.

    For lines built with f-strings whose values are not all reprs (vLLM's engine config line:
    ``served_model_name=meta-llama/Llama-3.1-8B``): splits at ``, name=`` outside brackets and
    quotes. Unbalanced brackets raise ReprError.
    """
    out: list[tuple[str, str]] = []
    level, i, n = 0, 0, len(text)
    if n > MAX_TEXT:
        raise ReprError(f"text longer than {MAX_TEXT} characters")
    cuts = [0]
    while i < n:
        c = text[i]
        if c in "'\"":
            m = _STRING.match(text, i)
            i = m.end() if m else i + 1
            continue
        if c in "([{":
            level += 1
            if level > MAX_DEPTH:
                raise ReprError(f"nested deeper than {MAX_DEPTH}")
        elif c in ")]}":
            level -= 1
            if level < 0:
                raise ReprError(f"unbalanced {c!r} at character {i}")
        elif c == "," and level == 0:
            if _CUT.match(text, i):
                cuts.append(i)
        i += 1
    if level:
        raise ReprError(f"{level} unclosed bracket(s)")
    cuts.append(n)
    for a, b in zip(cuts, cuts[1:]):
        part = text[a:b].lstrip(",").strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not _KEY.fullmatch(key.strip()):
            raise ReprError(f"expected name=value, got {part[:40]!r}")
        out.append((key.strip(), value.strip()))
        if len(out) > limit:
            raise ReprError(f"more than {limit} assignments")
    return out
