"""``eagleforensics fingerprint CAPTURE -o OUT.fp.json``: a small summary of a sweep that ``align`` accepts instead."""
from __future__ import annotations

from pathlib import Path

import click

from ..errors import printable
from .common import echo_text, run_guarded

CAPTURE_CONVENTIONS = ("hf", "vllm", "sglang", "trtllm")


@click.command()
@click.argument("capture", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Fingerprint file to write (.fp.json; a name ending in .gz is gzip-compressed).")
@click.option("--sketch-dim", "k", type=click.IntRange(min=8), default=64, show_default=True,
              help="Random-projection sketch size per token (error of a sketched cosine ~ (1-c^2)/sqrt(k)).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the projection.")
@click.option("--probes", type=click.IntRange(min=0), default=16, show_default=True,
              help="Tokens stored in full per position (they let align fit a post-norm gain).")
@click.option("--capture-convention", type=click.Choice(CAPTURE_CONVENTIONS), default="hf", show_default=True,
              help="What the integers in the capture mean (hf: output_hidden_states index).")
@click.option("--num-layers", type=click.IntRange(min=1), default=None, help="N, when the capture cannot tell.")
@click.option("--device", type=click.Choice(("cpu", "cuda", "auto")), default="cpu", show_default=True,
              help="Where the sketches are computed.")
@click.option("--allow-unsafe-pickle", is_flag=True,
              help="Allow full unpickling of .pt files. DANGEROUS: runs any code the file contains; trusted files only.")
def fingerprint(capture: str, output: str, k: int, seed: int, probes: int, capture_convention: str,
                num_layers: int | None, device: str, allow_unsafe_pickle: bool) -> None:
    """Summarise the CAPTURE sweep into a fingerprint file: per position, token norms, statistics, a content
    hash and a k-dim sketch of every token. `eagleforensics align TRAIN FINGERPRINT` then works anywhere,
    with estimated scores and a wider confidence margin (stated in its output).

    Exit 0: written. 2: bad input.
    """

    def run() -> Path:
        from ..evidence.fingerprint import make_fingerprint, write_fingerprint
        from ..io.capture import load_capture
        from ..io.guards import check_not_input

        src, out = Path(capture), Path(output)
        check_not_input(out, [(src, "the capture")], "fingerprint")  # by device+inode, and never inside it
        cap = load_capture(src, convention=capture_convention, num_layers=num_layers, allow_unsafe=allow_unsafe_pickle)
        return write_fingerprint(make_fingerprint(cap, k=k, seed=seed, probes=probes, device=device), out)

    written = run_guarded(run)
    size = written.stat().st_size
    source = Path(capture)
    whole = sum(f.stat().st_size for f in source.rglob("*") if f.is_file()) if source.is_dir() else source.stat().st_size
    echo_text(f"wrote {printable(written)} ({size / 1e6:.2f} MB, {size / max(whole, 1):.1%} of the capture)")
