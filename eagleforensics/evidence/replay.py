"""Drafter replay: run an EAGLE-3 drafter offline on the features a wiring feeds it and count accepted drafts.

The forward is plain torch (RMSNorm, rotary attention, SiLU MLP), written from the trainers'
published model definitions (SpecForge 0.2.0 ``llama3_eagle.py``, speculators 0.9.0
``eagle3/model_definitions.py``), not copied from them:

* step 1 at row t: ``fc`` maps the concatenated aux states of token t to H; the decoder layer reads
  ``cat(input_layernorm(embed(x[t+1])), hidden_norm(fc_out))`` (2H wide), residual = fc_out; then
  ``norm`` and ``lm_head`` give a draft token, mapped to the target vocabulary with ``d2t``;
* step k > 1 at row t: the layer's own output from step k-1 replaces fc_out, the token is x[t+k],
  and attention sees the step-1 keys of rows 0..t (the prefix cache) plus this row's own keys from
  steps 2..k, rotary position t+k-1: exactly the trainers' test-time-training unroll, which is
  also what a chain draft does at serving time.

The draft at step k is accepted when it equals the target's greedy token y[t+k] (the argmax of the
target lm_head on the final state of row t+k) and every earlier step of the chain was accepted.
Tokens fed at steps > 1 are the record's own ids (teacher forcing); when those ids are the target's
greedy output this is the same as feeding the drafter its own accepted drafts.
Memory is bounded by processing start rows in chunks: besides the inputs, only the step-1 keys and
values of the whole prefix ([T, kv_heads * head_dim] each) are held.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ..arrays import to_torch
from ..errors import ForensicsError
from ..io.drafter import Drafter, DrafterSpec
from ..positions import Position

ROW_CHUNK = 256


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32 with the learned gain."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))


def inv_frequencies(spec: DrafterSpec, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rotary inverse frequencies for ``head_dim``, with llama3 / linear scaling applied when configured."""
    d = spec.head_dim
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=device) / d))
    sc = spec.rope_scaling
    if sc is None:
        return inv.float()
    kind = sc.get("rope_type", sc.get("type"))
    factor = float(sc.get("factor", 1.0))
    if kind == "linear":
        return (inv / factor).float()
    low, high = float(sc.get("low_freq_factor", 1.0)), float(sc.get("high_freq_factor", 4.0))
    old = float(sc.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    between = (wavelen <= old / low) & (wavelen >= old / high)
    return torch.where(between, mid, scaled).float()


def _rotate(x: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of x [..., B, d] at positions pos [B]."""
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


class DraftForward:
    """The drafter's forward on float32 weights held on one device; ``weights`` may require grad (training)."""

    def __init__(self, spec: DrafterSpec, weights: dict[str, torch.Tensor], device: str = "cpu") -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.w = {k: (v.to(self.device, torch.float32) if v.is_floating_point() else v.to(self.device))
                  for k, v in weights.items()}
        self.inv = inv_frequencies(spec, self.device)

    @classmethod
    def of(cls, drafter: Drafter, device: str = "cpu") -> DraftForward:
        return cls(drafter.spec, drafter.weights, device)

    # -- pieces -------------------------------------------------------------------------------
    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """fc over the concatenated aux states [B, k*H_target] (after the optional input norms)."""
        s, w = self.spec, self.w
        x = aux.to(self.device, torch.float32)
        if "input_norm.weight" in w:
            x = rms_norm(x, w["input_norm.weight"], s.rms_norm_eps)
        if "fc_norm.0.weight" in w:
            x = torch.cat([rms_norm(c, w[f"fc_norm.{i}.weight"], s.rms_norm_eps)
                           for i, c in enumerate(x.chunk(s.num_aux, -1))], -1)
        return x @ w["fc.weight"].T

    def _qkv(self, emb: torch.Tensor, h: torch.Tensor, pos: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [heads, B, d], k, v [kv, B, d] (rotated) and the residual for rows with embeddings ``emb`` and state ``h``."""
        s, w = self.spec, self.w
        hn = rms_norm(h, w["layer.hidden_norm.weight"], s.rms_norm_eps)
        x = torch.cat([rms_norm(emb, w["layer.input_layernorm.weight"], s.rms_norm_eps), hn], -1)
        b = x.shape[0]
        q = (x @ w["layer.self_attn.q_proj.weight"].T).view(b, s.num_heads, s.head_dim).transpose(0, 1)
        k = (x @ w["layer.self_attn.k_proj.weight"].T).view(b, s.num_kv_heads, s.head_dim).transpose(0, 1)
        v = (x @ w["layer.self_attn.v_proj.weight"].T).view(b, s.num_kv_heads, s.head_dim).transpose(0, 1)
        if "layer.self_attn.q_norm.weight" in w:  # Qwen3-style per-head norms
            q = rms_norm(q, w["layer.self_attn.q_norm.weight"], s.rms_norm_eps)
            k = rms_norm(k, w["layer.self_attn.k_norm.weight"], s.rms_norm_eps)
        return _rotate(q, pos, self.inv), _rotate(k, pos, self.inv), v, (hn if s.norm_before_residual else h)

    def _finish(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """o_proj + residual, MLP + residual; returns (state fed to the next step, logits over the draft vocab)."""
        s, w = self.spec, self.w
        b = attn.shape[1]
        h = residual + attn.transpose(0, 1).reshape(b, s.num_heads * s.head_dim) @ w["layer.self_attn.o_proj.weight"].T
        m = rms_norm(h, w["layer.post_attention_layernorm.weight"], s.rms_norm_eps)
        h = h + (F.silu(m @ w["layer.mlp.gate_proj.weight"].T) * (m @ w["layer.mlp.up_proj.weight"].T)) \
            @ w["layer.mlp.down_proj.weight"].T
        normed = rms_norm(h, w["norm.weight"], s.rms_norm_eps)
        logits = (normed if s.norm_before_head else h) @ w["lm_head.weight"].T
        return (normed if s.feed_back_normed else h), logits

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.w["embed"][ids.to(self.device)]

    # -- the chain --------------------------------------------------------------------------
    def prefix_cache(self, h0: torch.Tensor, ids: torch.Tensor, chunk: int = ROW_CHUNK,
                     pos: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Step-1 keys and values of every row ([kv, T, d] each): what the drafter's KV cache holds for the prefix.

        ``pos`` (rotary position per row) defaults to the row index; training packs several sequences.
        """
        ks, vs = [], []
        nxt = _shift(ids, 1)
        pos = torch.arange(h0.shape[0], device=self.device) if pos is None else pos.to(self.device)
        for a in range(0, h0.shape[0], chunk):
            b = min(a + chunk, h0.shape[0])
            _, k, v, _ = self._qkv(self.embed(nxt[a:b]), h0[a:b], pos[a:b])
            ks.append(k)
            vs.append(v)
        return torch.cat(ks, 1), torch.cat(vs, 1)

    def chain(self, h0: torch.Tensor, ids: torch.Tensor, steps: int, a: int, b: int,
              cache: tuple[torch.Tensor, torch.Tensor], pos: torch.Tensor | None = None,
              doc: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
        """Logits [b-a, V_draft] of steps 1..``steps`` for start rows a..b-1 (fc outputs ``h0`` of all rows).

        ``pos`` and ``doc`` (rotary position and document id per row) let training pack sequences;
        rows then attend only within their own document.
        """
        s = self.spec
        k1, v1 = cache[0][:, :b], cache[1][:, :b]
        group = s.num_heads // s.num_kv_heads
        idx = torch.arange(a, b, device=self.device)
        rows = idx if pos is None else pos.to(self.device)[a:b]
        causal = idx[:, None] >= torch.arange(b, device=self.device)[None, :]  # [B, b]
        if doc is not None:
            doc = doc.to(self.device)
            causal = causal & (doc[a:b, None] == doc[None, :b])
        scale = 1.0 / math.sqrt(s.head_dim)
        h = h0[a:b]
        own_k: list[torch.Tensor] = []
        own_v: list[torch.Tensor] = []
        for step in range(1, steps + 1):
            q, k, v, residual = self._qkv(self.embed(_shift(ids, step)[a:b]), h, rows + step - 1)
            if step > 1:
                own_k.append(k)
                own_v.append(v)
            qg = q.view(s.num_kv_heads, group, b - a, s.head_dim)
            prefix = torch.einsum("kgbd,ksd->kgbs", qg, k1) * scale
            prefix = prefix.masked_fill(~causal, float("-inf"))
            diag = [(qg * kk[:, None]).sum(-1)[..., None] * scale for kk in own_k]  # [kv, g, B, 1] each
            p = torch.softmax(torch.cat([prefix] + diag, -1), -1)
            out = torch.einsum("kgbs,ksd->kgbd", p[..., :b], v1)
            for i, vv in enumerate(own_v):
                out = out + p[..., b + i, None] * vv[:, None]
            h, logits = self._finish(out.reshape(s.num_heads, b - a, s.head_dim), residual)
            yield logits


def _shift(ids: torch.Tensor, by: int) -> torch.Tensor:
    """ids[t + by] at row t, zero past the end (the trainers' right padding)."""
    if by == 0:
        return ids
    return torch.cat([ids[by:], ids.new_zeros(min(by, ids.shape[0]))])


def target_tokens(final_normed: torch.Tensor, lm_head: torch.Tensor, device: str = "cpu",
                  chunk: int = ROW_CHUNK) -> torch.Tensor:
    """The target's greedy next token per row: argmax of its lm_head on the post-norm final state."""
    head = lm_head.to(device, torch.float32)
    out = [(final_normed[a:a + chunk].to(device, torch.float32) @ head.T).argmax(-1).cpu()
           for a in range(0, final_normed.shape[0], chunk)]
    return torch.cat(out)


def speedup(accept_length: float, steps: int, cost_ratio: float) -> float:
    """Decode speed-up of chain speculation: L tokens per round of ``steps`` draft passes and one verify.

    One round costs ``steps * c + 1`` target forwards (c = draft/verify cost ratio) and yields
    ``L`` tokens on average, against 1 token per target forward without speculation.
    """
    return accept_length / (1.0 + steps * cost_ratio)


@dataclass(frozen=True)
class WiringReplay:
    """What one wiring gives: per-step acceptance, accept length for a chain of ``steps`` drafts."""

    label: str
    positions: list[Position]
    source: str
    steps: int
    starts: int
    acc: list[float]  # share of start rows whose step-k draft equals the target token (SpecForge acc_k)
    cond: list[float]  # P(step k accepted | steps 1..k-1 accepted)
    reach: list[float]  # P(steps 1..k all accepted) = vLLM's per-position acceptance rate
    accept_length: float  # 1 + sum(reach): tokens per verify, bonus token included
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def speedup(self, cost_ratio: float) -> float:
        return speedup(self.accept_length, self.steps, cost_ratio)

    def to_dict(self, cost_ratio: float | None = None) -> dict[str, Any]:
        out = {"label": self.label, "positions": [p.label for p in self.positions], "source": self.source,
               "steps": self.steps, "starts": self.starts, "acc": self.acc,
               "cond": [None if math.isnan(c) else c for c in self.cond],  # undefined once no chain survives
               "reach": self.reach, "accept_length": self.accept_length, "note": self.note or None}
        if cost_ratio is not None:
            out["speedup"] = self.speedup(cost_ratio)
        return out


def score(drafts: torch.Tensor, targets: torch.Tensor, starts: int) -> tuple[list[float], list[float], list[float], float]:
    """(acc, cond, reach, accept length) from target-vocab drafts [K, T] and target tokens y [T] over rows 0..starts-1."""
    steps = drafts.shape[0]
    if starts <= 0:
        raise ForensicsError(f"no start row has {steps} steps of target tokens after it; use fewer --steps")
    ok = torch.stack([drafts[k - 1, :starts] == targets[k:k + starts] for k in range(1, steps + 1)])
    chain = ok.cumprod(0).bool()
    acc = [float(r.float().mean()) for r in ok]
    reach = [float(r.float().mean()) for r in chain]
    cond = [reach[0]] + [reach[k] / reach[k - 1] if reach[k - 1] > 0 else float("nan") for k in range(1, steps)]
    return acc, cond, reach, 1.0 + sum(reach)


AuxRows = Callable[[int, int], torch.Tensor]


def _rows_of(aux: torch.Tensor | AuxRows) -> AuxRows:
    if isinstance(aux, torch.Tensor):
        return lambda a, b: aux[a:b]
    return aux


def replay_drafts(fwd: DraftForward, aux: torch.Tensor | AuxRows, ids: Any, steps: int,
                  chunk: int = ROW_CHUNK) -> torch.Tensor:
    """Drafted target-vocab token ids [steps, T] for every start row (rows near the end hold padding drafts).

    ``aux`` is the [T, k*H] feature tensor or a reader ``rows(a, b)`` of it, so the k*H-wide features are
    only ever held one chunk at a time (T = ``len(ids)``); the fc outputs [T, H] are kept.
    """
    rows = _rows_of(aux)
    ids = to_torch(ids)  # the capture's ids arrive as an array
    total = ids.shape[0]
    with torch.no_grad():
        h0 = torch.cat([fwd.project(rows(a, min(a + chunk, total))) for a in range(0, total, chunk)])
        ids = ids.to(fwd.device).long()
        cache = fwd.prefix_cache(h0, ids, chunk)
        out = torch.empty(steps, total, dtype=torch.long)
        d2t = fwd.w.get("d2t")
        for a in range(0, total, chunk):
            b = min(a + chunk, total)
            for k, logits in enumerate(fwd.chain(h0, ids, steps, a, b, cache)):
                d = logits.argmax(-1)
                out[k, a:b] = (d if d2t is None else d + d2t[d]).cpu()
    return out


def replay_wiring(fwd: DraftForward, aux: torch.Tensor | AuxRows, ids: torch.Tensor, targets: torch.Tensor,
                  steps: int, *, label: str, positions: list[Position], source: str, note: str = "",
                  chunk: int = ROW_CHUNK) -> WiringReplay:
    """Replay one wiring's features ([T, k*H] or a row reader) and score the chain against the target tokens."""
    if steps < 1:
        raise ForensicsError(f"steps must be at least 1, got {steps}")
    want = fwd.spec.num_aux * fwd.spec.target_hidden_size
    width = _rows_of(aux)(0, 1).shape[-1]
    if width != want:
        raise ForensicsError(f"wiring {label} gives {width} features per token; the drafter's fc reads {want} "
                             f"({fwd.spec.num_aux} states of {fwd.spec.target_hidden_size})")
    drafts = replay_drafts(fwd, aux, ids, steps, chunk=chunk)
    starts = ids.shape[0] - steps
    acc, cond, reach, length = score(drafts, targets, starts)
    return WiringReplay(label, list(positions), source, steps, starts, acc, cond, reach, length, note)
