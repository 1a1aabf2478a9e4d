"""A server's default temperature taken from the target's ``generation_config.json`` (docs/causes.md row 15).

``default-temperature``: SGLang ``sampling_defaults='model'`` (the default from 0.5.5) and vLLM
``generation_config='auto'`` (the default, 0.10.0 on) give every request that sets no temperature the
``temperature`` (``top_p``, ``top_k``) of the target's ``generation_config.json`` (``engines.servingrules`` topic
``generation-config``: SGLang configs/model_config.py ``get_default_sampling_params``, vLLM config/model.py
``get_diff_sampling_param``). A benchmark or client that expects greedy decoding then runs at T > 0, where
acceptance falls with the temperature and the verify rule decides how much (ml-explore/mlx-lm#1709,
SafeAILab/EAGLE#329, sgl-project/sglang#26312). Info: a true statement of the setting, priced by
``replay --temperature T``. Only ``generation_config.json`` is read, not the model card's prose.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..engines.servingargs import sampling_defaults
from ..engines.servingrules import serving_rule
from ..errors import ForensicsError, printable
from ..io.modeldir import read_config
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register

SOURCE = "ml-explore/mlx-lm#1709, SafeAILab/EAGLE#329, sgl-project/sglang#26312 (docs/causes.md row 15)"
OFF = {"sglang": "openai", "vllm": "vllm"}


def run(art: Artifacts) -> CheckResult:
    """Read the target's default temperature and whether this server applies it."""
    args = art.server_args
    if args is None or not args.speculative:
        return CheckResult((), "no speculative server in the log", {})
    path = Path(art.inputs.target or "") / "generation_config.json"
    if not path.is_file():
        return CheckResult((), "the target has no generation_config.json", {})
    try:
        gen = read_config(str(path), "generation_config.json")
    except ForensicsError:
        return CheckResult((), "generation_config.json not readable", {})
    temp = gen.get("temperature")
    sampled = gen.get("do_sample") is not False
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or temp <= 0 or not sampled:
        return CheckResult((), "generation_config.json sets no temperature above 0", {})
    rule = serving_rule("generation-config", args.engine, art.engine_version)
    key, value = sampling_defaults(args)
    data: dict[str, Any] = {"temperature": temp, "setting": f"{key}={value!r}"}
    if rule is None or rule.outcome != "applied" or (value is not None and value == OFF.get(args.engine)) or (
            value is None and args.engine == "sglang"):
        return CheckResult((), f"generation_config.json temperature {temp:g}, not applied by this server", data)
    extra = ", ".join(f"{k} {gen[k]}" for k in ("top_p", "top_k") if k in gen)
    msg = (f"requests that set no temperature are sampled at {temp:g}{' (' + extra + ')' if extra else ''}, taken "
           f"from the target's generation_config.json ({key}={value or 'default'!s}; {rule.source}): acceptance at "
           "T > 0 is below the greedy figure a benchmark may expect, by an amount the verify rule decides.")
    return CheckResult((Finding("default-temperature", "info", printable(msg),
                                fix=f"Price it with replay --temperature {temp:g}, or set temperature per request "
                                    f"(or {key}={OFF[args.engine]!r}) when measuring greedy acceptance.",
                                source=f"{rule.source}; {SOURCE}", impact="low"),),
                       f"default temperature {temp:g}", data)


CHECK = register(Check("default-temperature", "the server's default temperature from generation_config.json (--log, "
                       "--target)", ("default-temperature",), ("log", "target"), run, order=69))
