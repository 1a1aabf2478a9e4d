"""One bounded renderer for chat templates: jinja2's immutable sandbox, plus limits on time, size and loop steps.

A chat template is untrusted code from the model's files. jinja2's ``ImmutableSandboxedEnvironment``
stops escapes (attribute access, unsafe calls), but not work: ``{{ 'x' * 10**10 }}`` allocates
gigabytes in one step and two nested ``range(100000)`` loops run 10^10 iterations. This module
compiles every template (``compile_template``) in a ``BoundedSandbox`` that

* refuses, before computing it, a ``*`` / ``+`` / ``~`` / ``%`` / ``**`` whose result would hold more than
  ``MAX_VALUE`` characters or items (or an integer of more than ``MAX_INT_DIGITS`` digits), sizing
  containers by what they print (``text_size``: a list of references to one long string prints it
  once per reference), and any ``{{ value }}`` that would print more than ``MAX_OUTPUT_CHARS``;
* refuses calls and filters given an integer above ``MAX_ARG_INT`` (``center``, ``indent``,
  ``batch``...) or a format width above it, and any whose result could pass ``MAX_VALUE``
  (``_upper_bound``, from the inputs alone: ``join``, ``replace``, ``expandtabs``, ``format``...);
  ``lipsum`` is not offered and ``tojson``'s indent is at most ``MAX_JSON_INDENT``;
* counts loop iterations (every ``{% for %}`` is rewritten to iterate through a counter), calls,
  attribute reads and operator steps, at most ``MAX_STEPS`` per render, and checks a wall-clock
  deadline on each of them: ``MAX_SECONDS`` per render, ``MAX_TOTAL_SECONDS`` for every render of one
  template together (a template just under the step limit, rendered for 2000 served prompts);
* stops the output once it passes ``MAX_OUTPUT_CHARS``, and counts every string it builds against
  ``MAX_ALLOCATED`` characters per render.

``render_bounded`` renders; any failure (a limit, ``1/0``, a recursive macro's ``RecursionError``,
a ``TypeError``...) is a ``TemplateRefused`` with one line of text, which callers turn into a
``ForensicsError`` naming the template's file. The limits are far above what real chat templates
need (a real template renders a short conversation in a few hundred steps and a few KB).
"""
from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime
from typing import Any, Callable

MAX_VALUE = 8 << 20  # characters of one value a template may build (a served request line is at most 8 MiB)
MAX_OUTPUT_CHARS = 16 << 20  # characters of one render's output
MAX_ALLOCATED = 64 << 20  # characters of all strings built by one render
MAX_ARG_INT = 1 << 16  # an integer given to a call or filter (a width, an indent, a count); range() has its own
MAX_NODES = 1_000_000  # items walked to size one value
MAX_STEPS = 1_000_000  # loop iterations + calls + operator steps of one render
MAX_SECONDS = 10.0  # wall-clock time of one render
MAX_TOTAL_SECONDS = 30.0  # wall-clock time of every render of one template together (probes + served prompts)
MAX_INT_DIGITS = 4300  # Python's own limit for int <-> str conversions
MAX_JSON_INDENT = 64  # tojson(indent=...): real templates use 2 or 4
_DIGITS = re.compile(r"\d+")


class TemplateRefused(Exception):
    """A chat template failed or passed a limit while rendering; ``str(exc)`` is one line."""


def _size(x: Any) -> int | None:
    """Characters / items of a sequence a template can build, else None."""
    return len(x) if isinstance(x, (str, list, tuple, bytes)) else None


def text_size(x: Any, limit: int = MAX_ALLOCATED) -> int:
    """About how many characters ``str(x)`` has (strings by length, containers by their items, every reference
    counted as often as it appears), walking at most ``MAX_NODES`` items; past ``limit`` it returns ``limit + 1``
    at once. A list of a thousand references to one long string is a thousand times that string once printed."""
    total, nodes, stack = 0, 0, [x]
    while stack:
        v = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            return limit + 1
        if isinstance(v, (str, bytes)):
            total += len(v)
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(v)
            stack.extend(v)
        elif isinstance(v, dict):
            total += 2 + 4 * len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif type(v).__name__ == "Namespace":
            stack.append(dict(getattr(v, "_Namespace__attrs", {})))
        else:
            total += 24  # a number, None, an Undefined
        if total > limit:
            return limit + 1
    return total


def _shape(x: Any) -> tuple[int, int]:
    """(items, deepest nesting) of a JSON-like value, walking at most ``MAX_NODES`` items."""
    items, depth, stack = 0, 0, [(x, 1)]
    while stack and items <= MAX_NODES:
        v, d = stack.pop()
        items += 1
        depth = max(depth, d)
        if isinstance(v, dict):
            stack.extend((c, d + 1) for c in v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend((c, d + 1) for c in v)
    return items, depth


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
        """A value of ``n`` characters or items is about to be built (refused past ``MAX_VALUE``), and counted."""
        self.bound(n)
        self.chars += n
        if self.chars > MAX_ALLOCATED:
            raise TemplateRefused(f"chat template builds more than {MAX_ALLOCATED:,} characters for one conversation")

    @staticmethod
    def bound(n: int) -> None:
        """A value of at most ``n`` characters or items would be built: refused past ``MAX_VALUE``."""
        if n > MAX_VALUE:
            raise TemplateRefused(f"chat template builds a value of {n:,} characters or items (limit {MAX_VALUE:,})")


def _ints(values: Any) -> list[int]:
    return [abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _upper_bound(name: str, receiver: Any, args: tuple, kwargs: dict) -> int:
    """An upper bound on the characters a call or filter named ``name`` can return, from its inputs alone.

    The inputs' own size, plus, for every place the receiving text can grow (a line for ``indent``, a field for
    ``format`` / ``%``, a tab for ``expandtabs``, each character for ``replace`` / ``join`` / ``translate``), the
    widest thing it can grow by: the largest integer argument or format width, or the longest argument."""
    others = (*args, *kwargs.values())
    base = text_size(receiver) + sum(text_size(v) for v in others)
    widths = _ints(others)
    if isinstance(receiver, str):
        if name in ("format", "format_map", "%"):
            widths += [int(d) if len(d) < 12 else 10 ** 12 for d in _DIGITS.findall(receiver)]
        longest = max([text_size(v) for v in others] + [0])
        if name in ("replace", "join", "translate"):
            return base + (len(receiver) + 1) * max(longest, 1) + (text_size(args[0]) * len(receiver) if name == "join"
                                                                    and args else 0)
        places = max(1, receiver.count("\n") + 1, receiver.count("{"), receiver.count("%"), receiver.count("\t"))
        return base + places * max([longest, *widths, 0])
    if name == "join" and isinstance(receiver, (list, tuple)):
        sep = args[0] if args else kwargs.get("d", "")
        return base + len(receiver) * text_size(sep)
    return base + max(widths + [0])


def _guard_args(budget: "Callable[[], _Budget]", name: str, receiver: Any, args: tuple, kwargs: dict) -> None:
    """Before a call or filter runs: one step, integer arguments within ``MAX_ARG_INT`` (``range`` excepted: the
    sandbox bounds it), and the most it can return within ``MAX_VALUE``."""
    b = budget()
    b.step()
    if name not in ("safe_range", "range"):
        for v in _ints((*args, *kwargs.values())):
            if v > MAX_ARG_INT:
                raise TemplateRefused(f"chat template passes {name or 'a call'} an integer above {MAX_ARG_INT:,}")
    if name in ("format", "format_map", "%") and isinstance(receiver, str):
        for d in _DIGITS.findall(receiver):
            if len(d) > 6 or int(d) > MAX_ARG_INT:
                raise TemplateRefused(f"chat template formats with a width or precision above {MAX_ARG_INT:,}")
    b.bound(_upper_bound(name, receiver, args, kwargs))


def _guard_filter(name: str, func: Callable[..., Any], budget: "Callable[[], _Budget]") -> Callable[..., Any]:
    """``func`` (a jinja2 filter) with its arguments checked and its result counted."""
    import functools

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        values = [a for a in args if not _is_context(a)]
        receiver = values[0] if values else None
        _guard_args(budget, name, receiver, tuple(values[1:]), kwargs)
        out = func(*args, **kwargs)
        if (n := _size(out)) is not None:
            budget().built(n)
        return out

    return guarded


def _is_context(x: Any) -> bool:
    from jinja2 import Environment
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

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
                    if _size(seq) is not None and isinstance(n, int) and not isinstance(n, bool):
                        b.built(text_size(seq) * max(n, 0))
            elif operator == "+" and _size(left) is not None and _size(right) is not None:
                b.built(text_size(left) + text_size(right))
            elif operator == "%" and isinstance(left, str):
                _guard_args(self._b, "%", left, right if isinstance(right, tuple) else (right,), {})
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
            b.built(sum(text_size(p) for p in parts))  # before str(): a list of references prints each one
            return "".join(p if isinstance(p, str) else str(p) for p in parts)

        def ef_output(self, value: Any) -> Any:
            """``finalize``: every ``{{ value }}`` is sized before it is turned into text."""
            if text_size(value, MAX_OUTPUT_CHARS) > MAX_OUTPUT_CHARS:
                raise TemplateRefused(f"chat template prints a value of more than {MAX_OUTPUT_CHARS:,} characters")
            return value

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        if isinstance(indent, int) and not isinstance(indent, bool) and indent > MAX_JSON_INDENT:
            raise TemplateRefused(f"chat template indents JSON by {indent} (at most {MAX_JSON_INDENT})")
        if isinstance(indent, str) and len(indent) > MAX_JSON_INDENT:
            raise TemplateRefused(f"chat template indents JSON by {len(indent)} characters (at most "
                                  f"{MAX_JSON_INDENT})")
        if indent:  # every item on its own line, indented by its depth
            width = indent if isinstance(indent, int) else len(indent)
            items, depth = _shape(x)
            _Budget.bound(text_size(x) + items * (width * depth + 1))
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols])
    env.finalize = env.ef_output
    env.globals.pop("lipsum", None)  # random paragraphs: no chat template needs them, and lipsum(n) is n paragraphs
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
