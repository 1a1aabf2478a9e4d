"""Issue 40: a shard index is read for its ``weight_map`` only (``io.shardindex``): ``metadata`` is never built.

A 64 MiB ``model.safetensors.index.json`` whose ``metadata`` holds empty lists took ``doctor`` to 1.9 GiB. The
reader now decodes the weight_map alone; the answers equal ``json.loads``'s on every real and varied index, and
hostile ones are one line (exit 2) or read in bounded memory, measured on the process.
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from eagleforensics.errors import ForensicsError
from eagleforensics.io.modeldir import INDEX_NAME, MAX_INDEX_BYTES
from eagleforensics.io.shardindex import weight_map_of
from eagleforensics.testing.defects import SAMPLES

from .test_hardening import run_process

ROOT = Path(__file__).resolve().parent.parent


def _varied(rng: random.Random) -> dict:
    names = [f"model.layers.{i}.{k}\"\\\u00e9:{{[,]}}" if rng.random() < 0.2 else f"model.layers.{i}.{k}.weight"
             for i in range(rng.randint(1, 30)) for k in ("q", "k")]
    meta = rng.choice([{}, {"total_size": rng.randint(0, 10 ** 12)}, {"a": [[], {"b": ["]", "}", ",", ":"]}]},
                       {"format": "pt", "nested": {"x": [1, 2.5, None, True, "\\\""]}}])
    doc = {"metadata": meta, "weight_map": {n: f"model-{rng.randint(1, 3):05d}.safetensors" for n in names}}
    if rng.random() < 0.3:
        doc = {"weight_map": doc["weight_map"], "metadata": meta, "other": "weight_map"}
    return doc


def test_the_weight_map_equals_what_json_reads() -> None:
    real = (SAMPLES / "target" / INDEX_NAME).read_bytes()
    assert weight_map_of(real, Path("x")) == json.loads(real)["weight_map"]
    rng = random.Random(40)
    for _ in range(200):
        doc = _varied(rng)
        text = json.dumps(doc, indent=rng.choice([None, 1, 2]), ensure_ascii=rng.random() < 0.5).encode()
        assert weight_map_of(text, Path("x")) == doc["weight_map"]
    dup = b'{"weight_map": {"a": "x.safetensors"}, "weight_map": {"b": "y.safetensors"}}'
    assert weight_map_of(dup, Path("x")) == json.loads(dup)["weight_map"]  # the last one, as json keeps


@pytest.mark.parametrize("text, said", [
    (b"[1, 2]", "not a JSON object"),
    (b'{"weight_map": {"a": "x.safetensors"}', "not valid JSON"),
    (b'{"weight_map": {"a": "x.safetensors"}} {}', "not valid JSON"),
    (b'{"weight_map": {"a": "a\tb"}}', "not valid JSON"),
    (b'{"metadata": {}}', "no weight_map object"),
    (b'{"weight_map": [1]}', "no weight_map object"),
    (b'{"weight_map": {"a": ["x"]}}', "list or an object"),
    (b'{"weight_map": {"a": "\xff"}}', "not UTF-8"),
    (b'{"metadata": ' + b"[" * 100 + b"]" * 100 + b', "weight_map": {"a": "x.safetensors"}}', "nested more than"),
])
def test_a_bad_index_is_one_error_naming_it(text: bytes, said: str) -> None:
    with pytest.raises(ForensicsError, match=said) as err:
        weight_map_of(text, Path("t/model.safetensors.index.json"))
    assert "model.safetensors.index.json" in str(err.value)


def test_metadata_the_checks_never_read_is_skipped_unread() -> None:
    """A 5000-digit number or a million empty lists in metadata: never decoded, so neither refused nor built."""
    wm = b'"weight_map": {"a": "x.safetensors"}'
    assert weight_map_of(b'{"metadata": {"n": 1' + b"1" * 5000 + b"}, " + wm + b"}", Path("x")) == {"a": "x.safetensors"}
    assert weight_map_of(b'{"metadata": [' + b"[]," * 10 ** 6 + b"[]], " + wm + b"}", Path("x")) == {"a": "x.safetensors"}


def test_a_64_mib_index_of_empty_lists_stays_small(tmp_path: Path) -> None:
    """The issue's index: 64 MiB whose metadata is empty lists, beside the sample target's real weight_map."""
    target = shutil.copytree(SAMPLES / "target", tmp_path / "target")
    index = target / INDEX_NAME
    wmap = json.dumps(json.loads(index.read_text())["weight_map"]).encode()
    head, tail = b'{"metadata": {"x": [', b'[]]}, "weight_map": ' + wmap + b"}"
    count = (MAX_INDEX_BYTES - len(head) - len(tail)) // 3
    index.write_bytes(head + b"[]," * count + tail)
    assert index.stat().st_size > 63 * 1024 * 1024
    code, out, err, peak = run_process(["doctor", "--drafter", SAMPLES / "drafter", "--target", target,
                                        "--only", "sizes", "--json"], tmp_path, timeout=300)
    assert code in (0, 1) and "Traceback" not in err, (code, err[-1500:])
    assert {c["name"]: c for c in json.loads(out)["checks"]}["sizes"]["status"] == "clean"
    assert peak < 1024 ** 3, f"peak {peak / 2 ** 20:.0f} MiB"  # json.loads of the whole index took 1.9 GiB
