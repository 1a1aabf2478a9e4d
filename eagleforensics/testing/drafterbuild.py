"""Export a correctly made EAGLE-3 drafter (and the target files it is checked against) for a tiny target.

What the doctor's false-alarm measurement needs: for a ``tinymodels`` target of any family, seed and
RoPE, the files a user would hand the doctor when nothing is wrong. ``export_target`` writes the
target's config and, as a two-shard checkpoint with an index, the tensors the checks read
(embedding, final norm, lm_head). ``export_drafter`` writes a drafter the way its trainer would,
initialised as the trainers initialise one (transformers' ``normal(0, 0.02)``) and then fitted (``fit_drafter``: a short test-time-training
run on the target's own greedy sequences, among them the one ``write_record`` writes and
``write_capture`` starts, because a random tiny target's next token follows no language and a tiny
drafter predicts only what it has seen); a clean drafter must beat the ``drafter-baseline`` check's
lookup tables and must not sit at its init (``drafter-weights``):

* SpecForge layout (``specforge/modeling/draft/llama3_eagle.py`` names, 0.2.0): ``fc``, ``midlayer.*``,
  ``norm``, ``lm_head`` over the draft vocabulary (trained from scratch), ``embed_tokens`` copied from
  the target, ``d2t`` offsets and ``t2d`` mask of a frequency-pruned vocabulary (the
  ``draft_vocab_size`` most frequent of the target's own greedy tokens on seeded prompts), a config
  built from the target's (sizes, ``rms_norm_eps``, RoPE as transformers 4 keys,
  ``max_position_embeddings``);
* speculators layout (0.9.0 ``speculators/models/eagle3``): the same decoder layer under
  ``layers.0.``, the config nested in ``transformer_layer_config``, and ``lm_head`` = the target's
  ``lm_head`` rows at the draft ids (speculators copies and freezes them: not fitted);
* ModelOpt layout (nvidia-modelopt 0.47.0 ``export/plugins/hf_spec_export.py``, as ``engines.embedrules``
  reads it): the flat config, ``layers.0.``, the full vocabulary with the target's ``lm_head`` (frozen)
  and zero ``d2t`` offsets, no ``embed_tokens`` and no ``t2d``.

``write_record`` and ``write_capture`` give a training record (SpecForge layout) and a capture of the
same target from real forward passes.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..io.sweep import sweep, write_capture as write_sweep
from .tinymodels import prompt_ids

SPECFORGE, SPECULATORS, MODELOPT = "specforge", "speculators", "modelopt"
LAYOUTS = (SPECFORGE, SPECULATORS, MODELOPT)
FIT_STEPS = 60  # Adam steps of the short fit (a few seconds on one CPU thread)
FIT_LR = 1e-2


def greedy_tokens(model: torch.nn.Module, prompts: int = 32, seq_len: int = 64, seed: int = 1000) -> torch.Tensor:
    """The target's greedy next token at every position of ``prompts`` seeded prompts: [prompts, seq_len]."""
    vocab = model.config.vocab_size
    seqs = torch.stack([prompt_ids(seq_len, seed=seed + i, vocab=vocab) for i in range(prompts)])
    with torch.no_grad():
        return model(seqs).logits.argmax(-1)


def frequency_vocab(tokens: torch.Tensor, vocab: int, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``size`` most frequent ``tokens`` (ties by id), sorted: (target ids, d2t offsets, t2d mask)."""
    counts = torch.bincount(tokens.flatten(), minlength=vocab).double() - torch.arange(vocab) * 1e-9
    keep = counts.argsort(descending=True)[:size].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[keep] = True
    return keep, keep - torch.arange(size), t2d


def _text_cfg(model: torch.nn.Module) -> Any:
    cfg = model.config
    return getattr(cfg, "text_config", None) or cfg


def export_target(model: torch.nn.Module, out: Path, *, dtype: str = "bfloat16") -> Path:
    """config.json (``dtype`` declared, as a released checkpoint does) and the embedding, final norm and lm_head
    as two shards with ``model.safetensors.index.json``."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_dict()
    cfg["dtype"] = dtype
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True, default=str) + "\n")
    tdtype = getattr(torch, dtype)
    shard1 = {"model.embed_tokens.weight": model.get_input_embeddings().weight.detach().to(tdtype).contiguous(),
              "model.norm.weight": model.model.norm.weight.detach().to(tdtype).contiguous()}
    shard2 = {"lm_head.weight": model.lm_head.weight.detach().to(tdtype).contiguous()}
    names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    for name, tensors in zip(names, (shard1, shard2)):
        save_file(tensors, str(out / name), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {**{k: names[0] for k in shard1}, **{k: names[1] for k in shard2}}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out


def _rope_keys(tc: Any) -> dict[str, Any]:
    """The target's RoPE as a SpecForge draft config writes it (transformers 4 keys)."""
    params = dict(getattr(tc, "rope_parameters", None) or {})
    theta = params.pop("rope_theta", getattr(tc, "rope_theta", None) or 10000.0)
    out: dict[str, Any] = {"rope_theta": float(theta)}
    if params.get("rope_type", "default") != "default":
        out["rope_scaling"] = params
    return out


def draft_config(model: torch.nn.Module, draft_vocab: int, aux_ids: list[int] | None) -> dict[str, Any]:
    """A SpecForge draft config built from the target's."""
    tc = _text_cfg(model)
    hidden, heads = tc.hidden_size, 4
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
        "num_attention_heads": heads, "num_key_value_heads": 2, "head_dim": hidden // heads,
        "intermediate_size": tc.intermediate_size, "num_hidden_layers": 1, "hidden_act": "silu",
        "rms_norm_eps": tc.rms_norm_eps, "max_position_embeddings": tc.max_position_embeddings,
        "vocab_size": tc.vocab_size, "draft_vocab_size": draft_vocab, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", **_rope_keys(tc)}
    if aux_ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_ids)}
    return cfg


def _layer_weights(cfg: dict[str, Any], gen: torch.Generator, prefix: str) -> dict[str, torch.Tensor]:
    """The first decoder layer as transformers initialises it (``normal(0, 0.02)`` matrices, unit norm gains)."""
    h, d = cfg["hidden_size"], cfg["head_dim"]
    nh, nkv, inter = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]

    def lin(o: int, i: int) -> torch.Tensor:  # transformers' _init_weights: normal(0, initializer_range)
        return torch.randn(o, i, generator=gen) * 0.02

    w = {"self_attn.q_proj.weight": lin(nh * d, 2 * h), "self_attn.k_proj.weight": lin(nkv * d, 2 * h),
         "self_attn.v_proj.weight": lin(nkv * d, 2 * h), "self_attn.o_proj.weight": lin(h, nh * d),
         "mlp.gate_proj.weight": lin(inter, h), "mlp.up_proj.weight": lin(inter, h), "mlp.down_proj.weight": lin(h, inter),
         "input_layernorm.weight": torch.ones(h), "hidden_norm.weight": torch.ones(h),
         "post_attention_layernorm.weight": torch.ones(h)}
    return {prefix + k: v for k, v in w.items()}


def fit_sequences(model: torch.nn.Module, prompts: int = 3, seq_len: int = 64, seed: int = 1000) -> torch.Tensor:
    """The sequences the clean drafter is fitted on: ``write_record``'s own (its default prompt and the target's
    greedy answer, which also starts ``write_capture``'s prompt) and ``prompts`` seeded prompts: [S, seq_len]."""
    tc = _text_cfg(model)
    ids = prompt_ids(40, seed=7, vocab=tc.vocab_size)
    with torch.no_grad():
        for _ in range(seq_len - 40):
            ids = torch.cat([ids, model(ids[None]).logits[0, -1].argmax()[None]])
    others = [prompt_ids(seq_len, seed=seed + i, vocab=tc.vocab_size) for i in range(prompts)]
    return torch.stack([ids] + others)


def fit_drafter(model: torch.nn.Module, spec: Any, w: dict[str, torch.Tensor], positions: tuple[int, ...],
                keep: torch.Tensor, *, frozen: tuple[str, ...] = (), steps: int = FIT_STEPS, seed: int = 0
                ) -> dict[str, torch.Tensor]:
    """Train canonical weights ``w`` (``fc``, ``layer.*``, ``norm``, ``lm_head``) the way the trainers do (2-step
    test-time-training unroll, cross-entropy to the target's greedy token over the draft vocabulary) on
    ``fit_sequences``: a random tiny target's next token follows no language, so a tiny drafter predicts it
    only on text it has seen (as ``scripts/train_drafter.py`` does for the samples). Returns the trained weights."""
    import torch.nn.functional as F

    from ..drafter.replay import DraftForward

    seqs = fit_sequences(model)
    with torch.no_grad():
        hs = model(seqs, output_hidden_states=True).hidden_states
        aux = torch.cat([hs[p].to(torch.bfloat16).float() for p in positions], -1)
        targets = (hs[-1] @ model.lm_head.weight.T).argmax(-1)
    to_draft = torch.full((spec.vocab_size,), -100, dtype=torch.long)
    to_draft[keep] = torch.arange(keep.numel())
    labels = to_draft[targets]
    params = {k: v.clone().requires_grad_(k not in frozen and v.is_floating_point()) for k, v in w.items()}
    trained = [v for v in params.values() if v.requires_grad]
    opt = torch.optim.Adam(trained, lr=FIT_LR)
    s, t = seqs.shape
    ids, feats = seqs.flatten(), aux.flatten(0, 1)
    pos, doc = torch.arange(t).repeat(s), torch.arange(s).repeat_interleave(t)
    torch.manual_seed(seed)
    for _ in range(steps):
        fwd = DraftForward(spec, params)
        pre = fwd.prefix(fwd.project(feats), ids, chunk=ids.shape[0], pos=pos, doc=doc)
        loss = torch.zeros(())
        for k, logits in enumerate(fwd.chain(pre, 2, 0, ids.shape[0]), start=1):
            y = torch.cat([labels[:, k:], labels.new_full((s, k), -100)], 1).flatten()
            loss = loss + F.cross_entropy(logits, y, ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach() for k, v in params.items()}


def export_drafter(model: torch.nn.Module, out: Path, *, draft_vocab: int | None = None, layout: str = SPECFORGE,
                   aux_ids: list[int] | None = None, own_embedding: bool = True, prompts: int = 32, seq_len: int = 64,
                   seed: int = 0, fit_steps: int = FIT_STEPS) -> Path:
    """Write a correctly made drafter for ``model`` into ``out`` (see the module docstring): initialised as its
    trainer initialises one, then fitted (``fit_drafter``, ``fit_steps`` Adam steps; 0 leaves the init)."""
    from ..io.drafter import read_spec

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    tc = _text_cfg(model)
    vocab = tc.vocab_size
    n = vocab if layout == MODELOPT else (draft_vocab or vocab // 2)  # ModelOpt's default: the full vocabulary
    keep, d2t, t2d = frequency_vocab(greedy_tokens(model, prompts, seq_len), vocab, n)
    cfg = draft_config(model, n, aux_ids)
    gen = torch.Generator().manual_seed(seed)
    h = cfg["hidden_size"]
    w = _layer_weights(cfg, gen, "layer.")
    w["fc.weight"] = torch.randn(h, 3 * tc.hidden_size, generator=gen) * 0.02
    w["norm.weight"] = torch.ones(h)
    frozen: tuple[str, ...] = ("embed",)
    if layout == SPECFORGE:  # trained from scratch over the draft vocabulary
        w["lm_head.weight"] = torch.randn(n, h, generator=gen) * 0.02
    else:  # speculators: the target's head rows at the draft ids, frozen; ModelOpt (full vocabulary): the target's
        w["lm_head.weight"] = model.lm_head.weight.detach()[keep].clone()
        frozen += ("lm_head.weight",)
    w["d2t"] = d2t
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, sort_keys=True) + "\n")
    if fit_steps:
        positions = default_positions(tc.num_hidden_layers) if aux_ids is None else tuple(i + 1 for i in aux_ids)
        w = fit_drafter(model, read_spec(out), {**w, "embed": model.get_input_embeddings().weight.detach()},
                        positions, keep, frozen=frozen, steps=fit_steps, seed=seed)
        w.pop("embed")
    w.pop("d2t")
    prefix = "midlayer." if layout == SPECFORGE else "layers.0."
    w = {(prefix + k[len("layer."):] if k.startswith("layer.") else k): v for k, v in w.items()}
    if own_embedding and layout != MODELOPT:  # ModelOpt exports no embedding
        w["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().clone()
    stored = {k: v.to(torch.bfloat16).contiguous() for k, v in w.items()}
    stored["d2t"] = d2t.contiguous()
    if layout != MODELOPT:  # ModelOpt writes no t2d
        stored["t2d"] = t2d.contiguous()
    if layout == SPECULATORS:
        layer = {k: v for k, v in cfg.items() if k not in ("architectures", "eagle_config", "draft_vocab_size",
                                                           "torch_dtype")}
        cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
               "speculators_version": "0.9.0", "draft_vocab_size": n, "norm_before_residual": False,
               "transformer_layer_config": layer, "torch_dtype": "bfloat16",
               "eagle_aux_hidden_state_layer_ids": aux_ids,
               "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "target"}}}
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_file(dict(sorted(stored.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def default_positions(num_layers: int) -> tuple[int, int, int]:
    """The positions the engines capture by default (ids 1, N//2-1, N-4: p = 2, N//2, N-3)."""
    return 2, num_layers // 2, num_layers - 3


def write_record(model: torch.nn.Module, path: Path, *, length: int = 64, prompt: int = 40, seed: int = 7,
                 positions: tuple[int, ...] | None = None) -> Path:
    """A SpecForge-layout record (``input_ids``, ``loss_mask``, post-norm ``hidden_state``, ``aux_hidden_state``
    at ``positions``, default the engines'), the response part the target's own greedy continuation."""
    tc = _text_cfg(model)
    ids = prompt_ids(prompt, seed=seed, vocab=tc.vocab_size)
    with torch.no_grad():
        for _ in range(length - prompt):  # the answer is the target's own greedy output, as regenerated data is
            nxt = model(ids[None]).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt[None]])
        hs = model(ids[None], output_hidden_states=True).hidden_states
    pos = positions or default_positions(tc.num_hidden_layers)
    mask = torch.cat([torch.zeros(prompt), torch.ones(length - prompt)]).to(torch.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"input_ids": ids.clone(), "loss_mask": mask,
                "hidden_state": hs[tc.num_hidden_layers].to(torch.bfloat16).contiguous(),
                "aux_hidden_state": torch.cat([hs[p] for p in pos], -1).to(torch.bfloat16).contiguous()}, path)
    return path


def write_capture(model: torch.nn.Module, path: Path, *, length: int = 40, seed: int = 7) -> Path:
    """A capture-helper sweep of ``length`` prompt tokens (p = 0..N raw plus the post-norm final)."""
    ids = prompt_ids(length, seed=seed, vocab=_text_cfg(model).vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_sweep(path, sweep(model, ids), model)
