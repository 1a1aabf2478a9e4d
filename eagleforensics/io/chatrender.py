"""One bounded renderer for chat templates: jinja2's immutable sandbox, plus limits on time, size and loop steps.

A chat template is untrusted code from the model's files. jinja2's ``ImmutableSandboxedEnvironment``
stops escapes (attribute access, unsafe calls), but not work: ``{{ 'x' * 10**10 }}`` allocates
gigabytes in one step and two nested ``range(100000)`` loops run 10^10 iterations. This module
compiles every template (``compile_template``) in a ``BoundedSandbox`` that

* refuses, before computing it, a ``*`` / ``+`` / ``~`` / ``%`` / ``**`` whose result would hold more than
  ``MAX_VALUE`` characters or items (or an integer of more than ``MAX_INT_DIGITS`` digits);
* refuses calls and filters given an integer argument above ``MAX_VALUE`` (``center``, ``ljust``,
  ``indent``, ``zfill``, ``wordwrap``...), a format width above it, or a ``join`` / ``replace`` whose
  result would pass it;
* counts loop iterations (every ``{% for %}`` is rewritten to iterate through a counter), calls,
  attribute reads and operator steps, at most ``MAX_STEPS`` per render, and checks a wall-clock
  deadline on each of them: ``MAX_SECONDS`` per render, ``MAX_TOTAL_SECONDS`` for every render of one
  template together (a template just under the step limit, rendered for 2000 served prompts);
* stops the output once it passes ``MAX_OUTPUT_CHARS``, and counts every string it builds against
  ``MAX_ALLOCATED`` characters per render.

``render_bounded`` renders; any failure (a limit, ``1/0``, a recursive macro's ``RecursionError``,
a ``TypeError``...) is a ``TemplateRefused`` with one line of text, which callers turn into a
``ForensicsError`` naming the template's file. The limits are far above what real chat templates
need (the longest public ones render a conversation in a few hundred steps and a few KB).
"""
from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime
from typing import Any, Callable

MAX_VALUE = 1 << 20  # characters of one string (or items of one list) a template may build
MAX_OUTPUT_CHARS = 1 << 20  # characters of one render's output
MAX_ALLOCATED = 64 << 20  # characters of all strings built by one render
MAX_STEPS = 1_000_000  # loop iterations + calls + operator steps of one render
MAX_SECONDS = 10.0  # wall-clock time of one render
MAX_TOTAL_SECONDS = 30.0  # wall-clock time of every render of one template together (probes + served prompts)
MAX_INT_DIGITS = 4300  # Python's own limit for int <-> str conversions
_WIDTH = re.compile(r"\d{7,}")  # a format width or precision of a million or more


class TemplateRefused(Exception):
    """A chat template failed or passed a limit while rendering; ``str(exc)`` is one line."""


def _size(x: Any) -> int | None:
    """Characters / items of a sequence a template can build, else None."""
    return len(x) if isinstance(x, (str, list, tuple, bytes)) else None


class _Budget:
    """The steps, characters and deadline of one render (``left``: seconds the template has left in all)."""

    def __init__(self, left: float = MAX_SECONDS) -> None:
        self.steps = 0
        self.chars = 0
        self.start = time.monotonic()
        self.deadline = self.start + min(MAX_SECONDS, left)
        self.total = left < MAX_SECONDS

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > MAX_STEPS:
            raise TemplateRefused(f"chat template ran more than {MAX_STEPS:,} steps (loop iterations and calls) "
                                  "for one conversation")
        if time.monotonic() > self.deadline:
            if self.total:
                raise TemplateRefused(f"chat template ran longer than {MAX_TOTAL_SECONDS:g} s over all the "
                                      "conversations rendered with it")
            raise TemplateRefused(f"chat template ran longer than {MAX_SECONDS:g} s for one conversation")

    def built(self, n: int) -> None:
        if n > MAX_VALUE:
            raise TemplateRefused(f"chat template builds a value of {n:,} characters or items (limit {MAX_VALUE:,})")
        self.chars += n
        if self.chars > MAX_ALLOCATED:
            raise TemplateRefused(f"chat template builds more than {MAX_ALLOCATED:,} characters for one conversation")


def _check_int(value: Any, what: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_VALUE:
        raise TemplateRefused(f"chat template passes {what} an integer above {MAX_VALUE:,}")


def _check_format(fmt: Any) -> None:
    if isinstance(fmt, str) and _WIDTH.search(fmt):
        raise TemplateRefused("chat template formats with a width or precision of a million or more")


def _estimate(name: str, receiver: Any, args: tuple, kwargs: dict) -> int:
    """An upper bound on the size of a join / replace before it runs (0 when not one of those)."""
    if name == "join" and isinstance(receiver, str) and args and isinstance(args[0], (list, tuple, str)):
        items = args[0]
        return sum(len(i) if isinstance(i, str) else 1 for i in items) + len(receiver) * len(items)
    if name == "replace" and isinstance(receiver, str) and len(args) >= 2 and isinstance(args[1], str):
        return len(receiver) + (len(receiver) + 1) * len(args[1])
    return 0


def _guard_args(budget: "Callable[[], _Budget]", name: str, receiver: Any, args: tuple, kwargs: dict) -> None:
    b = budget()
    b.step()
    for v in (*args, *kwargs.values()):
        _check_int(v, name or "a call")
    if name in ("format", "format_map"):
        _check_format(receiver)
    b.built(_estimate(name, receiver, args, kwargs))


def _guard_filter(name: str, func: Callable[..., Any], budget: "Callable[[], _Budget]") -> Callable[..., Any]:
    """``func`` (a jinja2 filter) with its arguments checked and its result counted."""
    import functools

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        values = [a for a in args if not _is_context(a)]
        receiver = values[0] if values else None
        _guard_args(budget, name, receiver, tuple(values[1:]), kwargs)
        if name == "format":
            _check_format(receiver)
        if name in ("join", "replace") and isinstance(receiver, (list, tuple, str)):
            sep = values[1] if len(values) > 1 else kwargs.get("d", "")
            if name == "join":
                budget().built(sum(len(str(i)) if isinstance(i, str) else 8 for i in receiver)
                               + len(str(sep)) * len(receiver))
            else:
                new = values[2] if len(values) > 2 else kwargs.get("new", "")
                budget().built(len(receiver) + (len(receiver) + 1) * len(str(new)))
        out = func(*args, **kwargs)
        if (n := _size(out)) is not None:
            budget().built(n)
        return out

    return guarded


def _is_context(x: Any) -> bool:
    from jinja2.runtime import Context
    from jinja2.nodes import EvalContext
    from jinja2 import Environment

    return isinstance(x, (Context, EvalContext, Environment))


def _make_env() -> Any:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):  # type: ignore[misc]
        """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask marker) renders its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    class BoundedSandbox(ImmutableSandboxedEnvironment):  # type: ignore[misc]
        """The immutable sandbox with every operator, call, attribute read and loop step counted and bounded."""

        intercepted_binops = frozenset({"*", "+", "%", "**", "//", "/", "-"})
        intercepted_unops = frozenset({"-", "+"})
        local = threading.local()  # the budget of the render running on this thread

        def _b(self) -> _Budget:
            b = getattr(self.local, "budget", None)
            return _Budget() if b is None else b  # None: compile-time constant folding

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            b = self._b()
            b.step()
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if _size(seq) is not None and isinstance(n, int):
                        b.built(_size(seq) * max(n, 0))  # type: ignore[operator]
            elif operator == "+" and _size(left) is not None and _size(right) is not None:
                b.built(_size(left) + _size(right))  # type: ignore[operator]
            elif operator == "%" and isinstance(left, str):
                _check_format(left)
                for v in (right if isinstance(right, (tuple, list)) else (right,)):
                    _check_int(v, "a % format")
                b.built(len(left) + sum(len(str(v)) if isinstance(v, str) else 32 for v in
                                        (right if isinstance(right, (tuple, list)) else (right,))))
            elif operator == "**" and isinstance(left, (int, float)) and isinstance(right, (int, float)):
                import math

                if abs(left) > 1 and right > 0 and right * math.log10(abs(left)) > MAX_INT_DIGITS:
                    raise TemplateRefused(f"chat template raises a number to a power of more than {MAX_INT_DIGITS} "
                                          "digits")
            out = self.binop_table[operator](left, right)
            if isinstance(out, int) and out.bit_length() > MAX_INT_DIGITS * 4:
                raise TemplateRefused(f"chat template builds an integer of more than {MAX_INT_DIGITS} digits")
            return out

        def call_unop(self, context: Any, operator: str, arg: Any) -> Any:
            self._b().step()
            return self.unop_table[operator](arg)

        def getattr(self, obj: Any, attribute: str) -> Any:
            self._b().step()
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            self._b().step()
            return super().getitem(obj, argument)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            name = getattr(__obj, "__name__", "")
            receiver = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)  # str.format is wrapped
            _guard_args(__self._b, name, receiver, args, kwargs)
            out = super().call(__context, __obj, *args, **kwargs)
            if (n := _size(out)) is not None:
                __self._b().built(n)
            return out

        def ef_loop(self, iterable: Any) -> Any:
            """Every ``{% for %}`` iterates through here: one step per item."""
            b = self._b()
            for item in iterable:
                b.step()
                yield item

        def ef_concat(self, *parts: Any) -> str:
            """``a ~ b``: the joined size checked before joining."""
            b = self._b()
            b.step()
            strs = [p if isinstance(p, str) else str(p) for p in parts]
            b.built(sum(map(len, strs)))
            return "".join(strs)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.filters = {name: _guard_filter(name, f, env._b) for name, f in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def compile_template(source: str) -> Any:
    """``source`` compiled in a ``BoundedSandbox``: every ``for`` iterates through ``ef_loop`` and every ``~``
    joins through ``ef_concat`` (a rewrite of the parsed tree); a syntax error raises ``TemplateSyntaxError``."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    class Rewrite(NodeTransformer):  # type: ignore[misc]
        def visit_For(self, node: Any) -> Any:
            self.generic_visit(node)
            node.iter = nodes.Call(nodes.EnvironmentAttribute("ef_loop"), [node.iter], [], None, None,
                                   lineno=node.lineno)
            return node

        def visit_Concat(self, node: Any) -> Any:
            self.generic_visit(node)
            return nodes.Call(nodes.EnvironmentAttribute("ef_concat"), list(node.nodes), [], None, None,
                              lineno=node.lineno)

    env = _make_env()
    tree = Rewrite().visit(env.parse(source))
    return env.from_string(tree)


def render_bounded(template: Any, **context: Any) -> str:
    """``template`` (from ``compile_template``) rendered within the limits; every failure is ``TemplateRefused``."""
    env = template.environment
    spent = getattr(env, "spent", 0.0)
    env.local.budget = budget = _Budget(MAX_TOTAL_SECONDS - spent)
    if spent >= MAX_TOTAL_SECONDS:
        raise TemplateRefused(f"chat template ran longer than {MAX_TOTAL_SECONDS:g} s over all the conversations "
                              "rendered with it")
    out: list[str] = []
    total = 0
    try:
        for chunk in template.generate(**context):
            total += len(chunk)
            if total > MAX_OUTPUT_CHARS:
                raise TemplateRefused(f"chat template rendered more than {MAX_OUTPUT_CHARS:,} characters for one "
                                      "conversation")
            out.append(chunk)
            budget.step()
    except TemplateRefused:
        raise
    except RecursionError:
        raise TemplateRefused("chat template recursed without end (RecursionError)") from None
    except MemoryError:
        raise TemplateRefused("chat template ran out of memory") from None
    except Exception as exc:  # the template is untrusted code: whatever it raises is bad input
        raise TemplateRefused(f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}") from None
    finally:
        env.local.budget = None
        env.spent = spent + (time.monotonic() - budget.start)
    return "".join(out)
