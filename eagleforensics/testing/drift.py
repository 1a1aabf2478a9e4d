"""Serving drift on tiny real models: the same prompt through other dtypes, kernels, weights and routing.

A real capture never equals the training data bit for bit. These builders produce the
drifts a serving stack introduces, on ``tinymodels`` forward passes, and *measure* each
drift so tests can assert it happened (routing flips counted from the router's own choice,
quantisation error of the weights, neighbour cosines of the stream):

* ``forward_states``: every residual-stream position (raw p=0..N and the post-norm final)
  of one forward pass in a chosen dtype and attention kernel, with the MoE routers'
  top-k choice per layer;
* ``fake_quant_int4``: group-wise symmetric INT4 round-trip of a model's weights (experts
  only, or every linear), as a W4A16 serving stack stores them;
* ``scale_layer_writes``: a layer whose writes into the stream are scaled (near-identity).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class States:
    """One forward pass: raw positions p=0..N (float32 copies), the post-norm final, router choices."""

    raw: list[torch.Tensor]  # [T, H] each, p = 0..N
    normed: torch.Tensor  # final state after the norm
    routes: dict[int, torch.Tensor]  # decoder layer -> [T, k] expert ids (sorted), MoE layers only

    @property
    def n(self) -> int:
        return len(self.raw) - 1


@torch.no_grad()
def forward_states(model: torch.nn.Module, ids: torch.Tensor, dtype: torch.dtype = torch.float32,
                   attn: str | None = None) -> States:
    """Run ``model`` (a copy cast to ``dtype``, attention ``attn`` if given) on ``ids``; keep every state."""
    m = copy.deepcopy(model).to(dtype)
    if attn is not None:
        m.config._attn_implementation = attn
        for mod in m.modules():
            if hasattr(mod, "config") and hasattr(mod.config, "_attn_implementation"):
                mod.config._attn_implementation = attn
    routes: dict[int, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(m.model.layers):
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if gate is not None and hasattr(gate, "top_k"):
            hooks.append(gate.register_forward_hook(
                lambda _m, _a, out, i=i: routes.__setitem__(i, out[2].sort(-1).values.detach().clone())))
    grabbed: dict[str, torch.Tensor] = {}
    hooks.append(m.model.norm.register_forward_hook(
        lambda _m, args, out: grabbed.update(raw=args[0].detach(), normed=out.detach())))
    try:
        hs = m(input_ids=ids.reshape(1, -1), output_hidden_states=True, use_cache=False).hidden_states
    finally:
        for h in hooks:
            h.remove()
    n = len(hs) - 1
    raw = [hs[p][0].float() for p in range(n)] + [grabbed["raw"][0].float()]
    return States(raw, grabbed["normed"][0].float(), routes)


def routing_flips(a: States, b: States) -> dict[int, int]:
    """Per MoE layer, how many tokens' top-k expert sets differ between two passes."""
    return {i: int((a.routes[i] != b.routes[i]).any(-1).sum()) for i in a.routes if i in b.routes}


def _quant_groups(w: torch.Tensor, group: int) -> torch.Tensor:
    """Symmetric INT4 (levels -8..7) round-trip of ``w`` in groups of ``group`` along its last dim."""
    shape = w.shape
    g = min(group, shape[-1])
    pad = (-shape[-1]) % g
    x = torch.nn.functional.pad(w, (0, pad)).reshape(*shape[:-1], -1, g)
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 7.0
    q = torch.clamp(torch.round(x / scale), -8, 7) * scale
    return q.reshape(*shape[:-1], -1)[..., :shape[-1]].reshape(shape)


@torch.no_grad()
def fake_quant_int4(model: torch.nn.Module, scope: str = "experts", group: int = 128) -> tuple[torch.nn.Module, float]:
    """A copy of ``model`` whose weights went through group-wise INT4; also the relative weight error.

    ``scope``: ``experts`` (routed experts only, as MoE checkpoints are often shipped) or
    ``all`` (every linear of the decoder layers; embeddings, norms and routers stay).
    """
    m = copy.deepcopy(model)
    err = tot = 0.0
    for name, p in m.model.layers.named_parameters():
        if p.dim() < 2 or "norm" in name or ".gate.weight" in name:
            continue
        if scope == "experts" and ".experts." not in name:
            continue
        q = _quant_groups(p.data, group)
        err += float((q - p.data).square().sum())
        tot += float(p.data.square().sum())
        p.data.copy_(q)
    return m, (err / tot) ** 0.5 if tot else 0.0


@torch.no_grad()
def scale_layer_writes(model: torch.nn.Module, layer: int, scale: float) -> torch.nn.Module:
    """A copy of ``model`` whose decoder layer ``layer`` writes ``scale`` times less into the stream."""
    m = copy.deepcopy(model)
    block = m.model.layers[layer]
    for name, p in block.named_parameters():
        if name.endswith(("o_proj.weight", "down_proj.weight", "down_proj")):
            p.mul_(scale)
    return m


def neighbour_cosine(states: States, p: int) -> float:
    """Median per-token cosine between raw positions p and p+1 of one pass."""
    c = torch.nn.functional.cosine_similarity(states.raw[p], states.raw[p + 1], dim=-1)
    return float(c.median())
