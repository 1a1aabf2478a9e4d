"""Drafter replay: run an EAGLE-3 drafter offline on the features a wiring feeds it and count accepted drafts.

The forward is plain torch (RMSNorm, rotary attention, SiLU MLP), written from the trainers'
published model definitions (SpecForge 0.2.0 ``llama3_eagle.py``, speculators 0.9.0
``eagle3/core.py`` + ``eagle3/model_definitions.py``), not copied from them:

* step 1 at row t: ``fc`` maps the concatenated aux states of token t to H; the first decoder layer
  reads ``cat(input_layernorm(embed(x[t+1])), hidden_norm(fc_out))`` (2H wide), residual = fc_out;
  later layers (speculators' ``num_hidden_layers > 1``) are plain decoder layers on the residual
  stream; then ``norm`` and ``lm_head`` give a draft token, mapped to the target vocabulary with ``d2t``;
* step k > 1 at row t: the drafter's own output from step k-1 replaces fc_out, the token is x[t+k],
  and every layer's attention sees that layer's step-1 keys of rows 0..t (the prefix cache) plus
  this row's own keys from steps 2..k, rotary position t+k-1: exactly the trainers' test-time-training
  unroll, which is also what a chain draft does at serving time. A sliding-window layer sees only
  prefix rows j > t - window (speculators' mask; the own keys always).

The draft at step k is accepted when it equals the target's greedy token y[t+k] (the argmax of the
target lm_head on the final state of row t+k) and every earlier step of the chain was accepted.
Tokens fed at steps > 1 are the record's own ids (teacher forcing); when those ids are the target's
greedy output this is the same as feeding the drafter its own accepted drafts.

Beside the greedy chain: the expected acceptance at temperature T (``replay_chain``: per step
``p_T(draft)`` for greedy drafts verified by sampling, and ``sum(min(p_T, q_T))`` for drafts sampled
from the drafter, Leviathan rejection sampling), and the accept length of SGLang's EAGLE tree
(``tree_depths``: top-k expansion per step, the best ``draft_tokens - 1`` nodes verified), simulated
node by node with the drafter's own tokens.

Memory is bounded: start rows go through in chunks sized so that one attention score block holds at
most ``ATTN_BUDGET`` floats (kv heads are split further when one row alone exceeds it); besides the
inputs, only each layer's step-1 keys and values of the whole prefix ([kv_heads, T, head_dim] each)
are held. Rows whose aux states hold NaN/Inf are fed zeros, masked out of every attention and never
counted: a non-finite input is reported, never scored.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..arrays import to_torch
from ..errors import ForensicsError
from ..io.diskrows import DiskRows, all_finite, head_block
from ..io.drafter import Drafter, DrafterSpec
from ..io.served import EXTRA_LAYERS, OWN_EMBEDDING, SERVED_FEATURES
from ..positions import Position

ROW_CHUNK = 256
HEAD_BLOCK = 8192  # lm_head rows widened to float32 at once (a 7168-wide block: 235 MB)
GREEDY_ROWS = 4096  # final states multiplied with each widened block at once (7168 wide: 117 MB, logits 134 MB)
_GATHERED = ("embed", "target_embed")  # weights kept as stored: only the rows a step looks up are widened
ATTN_BUDGET = 1 << 24  # floats in one attention score block (64 MiB); the softmax copies it about twice

AuxRows = Callable[[int, int], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32 with the learned gain."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))


def rope_tables(spec: DrafterSpec, device: torch.device | str = "cpu") -> tuple[torch.Tensor, float]:
    """Rotary inverse frequencies for ``head_dim`` and the attention scaling the cos/sin tables carry.

    default, ``linear`` (positions / factor), ``llama3`` (wavelength-banded) and ``yarn`` (ramped
    interpolation plus an attention factor on cos and sin), following the definitions transformers 5.24
    uses (``modeling_rope_utils``); written here, not imported, so replay needs no model class. SpecForge
    0.2.0's own YaRN class (``LlamaYarnRotaryEmbedding``) needs ``beta_fast``, ``beta_slow``, ``mscale`` and
    ``mscale_all_dim`` in the config and always divides by the ``mscale_all_dim`` factor; it agrees with these
    tables when both mscales are set and non-zero, or ``mscale`` is 1.
    """
    d = spec.head_dim
    exps = torch.arange(0, d, 2, dtype=torch.float64, device=device) / d
    inv = 1.0 / (spec.rope_theta ** exps)
    sc = spec.rope_scaling
    if sc is None:
        return inv.float(), 1.0
    kind = sc["rope_type"]
    factor = float(sc["factor"])
    if kind == "linear":
        return (inv / factor).float(), 1.0
    if kind == "llama3":
        low, high = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
        old = float(sc["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        between = (wavelen <= old / low) & (wavelen >= old / high)
        return torch.where(between, mid, scaled).float(), 1.0
    # yarn: interpolate the low frequencies, keep the high ones, ramp between (beta_fast/beta_slow rotations)
    old = float(sc["original_max_position_embeddings"])

    def dim_of(rotations: float) -> float:  # the dimension whose wavelength fits ``rotations`` turns in ``old``
        return d * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(spec.rope_theta))

    low, high = dim_of(float(sc["beta_fast"])), dim_of(float(sc["beta_slow"]))
    if sc.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64, device=device) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1 = extrapolate (keep the frequency), 0 = interpolate (divide by factor)
    inv = (inv / factor) * (1 - keep) + inv * keep

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = sc.get("attention_factor")
    if attn is None:
        m, m_all = sc.get("mscale"), sc.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return inv.float(), float(attn)


def inv_frequencies(spec: DrafterSpec, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rotary inverse frequencies for ``head_dim`` with the configured scaling (see ``rope_tables``)."""
    return rope_tables(spec, device)[0]


def _rotate(x: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of x [..., B, d] at positions pos [B]; cos/sin times ``scale``."""
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def _shift(ids: torch.Tensor, by: int) -> torch.Tensor:
    """ids[t + by] at row t, zero past the end (the trainers' right padding)."""
    if by == 0:
        return ids
    return torch.cat([ids[by:], ids.new_zeros(min(by, ids.shape[0]))])


@dataclass
class Prefix:
    """What every start row's chain reads from the whole sequence: fc outputs, ids, each layer's step-1 keys/values.

    ``pos`` (rotary position per row) and ``doc`` (document id per row) let training pack several sequences;
    ``valid`` marks rows whose aux states were finite (the others are never attended to).
    """

    h0: torch.Tensor  # [T, H]
    ids: torch.Tensor  # [T] long
    caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: K, V [kv, T, d]
    pos: torch.Tensor  # [T]
    doc: torch.Tensor | None = None
    valid: torch.Tensor | None = None  # [T] bool

    @property
    def rows(self) -> int:
        return int(self.h0.shape[0])


Own = list[list[tuple[torch.Tensor, torch.Tensor]]]  # per layer: (k, v) [kv, Q, d] per earlier step of each query


class DraftForward:
    """The drafter's forward on float32 weights held on one device; ``weights`` may require grad (training).

    ``drop`` names ``io.drafter.SERVED_FEATURES`` to leave out, as an engine that ignores them would serve the
    drafter (``replay --served-without``).
    """

    def __init__(self, spec: DrafterSpec, weights: dict[str, torch.Tensor], device: str = "cpu",
                 drop: frozenset[str] | set[str] = frozenset(), consume: bool = False) -> None:
        unknown = sorted(set(drop) - set(SERVED_FEATURES))
        if unknown:
            raise ForensicsError(f"unknown served-without feature {', '.join(unknown)} (known: "
                                 f"{', '.join(SERVED_FEATURES)})")
        self.spec = spec
        self.device = torch.device(device)
        # the embeddings stay in their stored dtype (a Kimi-size one is 2.35 GB bf16, 4.7 GB widened): a step
        # gathers its rows and widens those (``embed``); every other weight is float32 for the products
        def ready(k: str, v: torch.Tensor) -> torch.Tensor:
            if k == "embed" and OWN_EMBEDDING in drop and "target_embed" in weights:
                return v  # served without it: the drafter's own embedding stays in its file (2.35 GB at Kimi size)
            if not v.is_floating_point() or k in _GATHERED:
                return v.to(self.device)
            if self.device.type != "cpu":  # the stored dtype crosses the bus, widened on the device
                return v.to(self.device).to(torch.float32)
            return v.to(torch.float32)
        if consume:  # ``weights`` converted in place: each stored tensor is freed as its float32 copy is made
            for k in list(weights):
                weights[k] = ready(k, weights[k])
            self.w = dict(weights)
        else:
            self.w = {k: ready(k, v) for k, v in weights.items()}
        self.inv, self.rope_scale = rope_tables(spec, self.device)
        d2t = self.w.get("d2t")
        self.draft_ids = torch.arange(spec.draft_vocab_size, device=self.device)
        if d2t is not None:
            self.draft_ids = self.draft_ids + d2t.long()  # draft id -> target id
        self._configure(frozenset(drop))

    def _configure(self, drop: frozenset[str]) -> None:
        """The switches of the forward, with the ``drop``ped features left out."""
        spec = self.spec
        self.drop = drop
        self.embed_weight = self.w.get("embed")
        if OWN_EMBEDDING in drop:
            if "target_embed" not in self.w:
                raise ForensicsError("serving without the drafter's own embed_tokens needs the target's embedding "
                                     "(pass --target)")
            self.embed_weight = self.w["target_embed"]
        self.layers = 1 if EXTRA_LAYERS in drop else spec.num_layers
        self.sliding = frozenset(() if "sliding_window" in drop else spec.sliding_layers)
        default_head = "norm_output" in drop
        self.norm_before_head = True if default_head else spec.norm_before_head
        self.feed_back_normed = False if default_head else spec.feed_back_normed
        self.norm_before_residual = spec.norm_before_residual and "norm_before_residual" not in drop

    def without(self, drop: frozenset[str] | set[str]) -> DraftForward:
        """The same drafter (weights shared, not copied) served without the ``drop``ped features."""
        unknown = sorted(set(drop) - set(SERVED_FEATURES))
        if unknown:
            raise ForensicsError(f"unknown served-without feature {', '.join(unknown)}")
        other = copy.copy(self)
        other._configure(frozenset(drop))
        return other

    @classmethod
    def of(cls, drafter: Drafter, device: str = "cpu", drop: frozenset[str] | set[str] = frozenset(),
           consume: bool = False) -> DraftForward:
        """The forward of ``drafter``; ``consume``: its weights dict is converted in place (the stored copies are not
        held beside the float32 ones: a Kimi-size drafter's peak is its float32 size, not 1.5x it)."""
        return cls(drafter.spec, drafter.weights, device, drop, consume)

    def to_target(self, draft: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target-vocabulary ids."""
        return self.draft_ids[draft]

    def target_to_draft(self) -> torch.Tensor:
        """[V_target] draft id of each target token, -1 for tokens outside the draft vocabulary."""
        out = torch.full((self.spec.vocab_size,), -1, dtype=torch.long, device=self.device)
        out[self.draft_ids] = torch.arange(self.spec.draft_vocab_size, device=self.device)
        return out

    def row_chunk(self, rows: int, width: int = 1) -> int:
        """Start rows per chunk so one score block ([heads, chunk*width, rows]) and the logits stay in budget."""
        per_row = width * max(self.spec.num_heads * max(rows, 1), self.spec.draft_vocab_size, self.spec.vocab_size)
        return max(1, min(ROW_CHUNK, ATTN_BUDGET // per_row))

    # -- pieces -------------------------------------------------------------------------------
    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """fc over the concatenated aux states [B, k*H_target] (after the optional input norms)."""
        s, w = self.spec, self.w
        x = aux.to(self.device, torch.float32)
        if "input_norm.weight" in w and "norm_before_fc" not in self.drop:
            x = rms_norm(x, w["input_norm.weight"], s.rms_norm_eps)
        if "fc_norm.0.weight" in w and "fc_norm" not in self.drop:
            x = torch.cat([rms_norm(c, w[f"fc_norm.{i}.weight"], s.rms_norm_eps)
                           for i, c in enumerate(x.chunk(s.num_aux, -1))], -1)
        return x @ w["fc.weight"].T

    def project_rows(self, aux: torch.Tensor | AuxRows, total: int, chunk: int = ROW_CHUNK
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """fc outputs [T, H] and which rows had finite aux states; non-finite rows are projected from zeros."""
        rows = _rows_of(aux)
        outs, valid = [], []
        for a in range(0, total, chunk):
            x = rows(a, min(a + chunk, total)).to(self.device, torch.float32)
            ok = torch.isfinite(x).all(-1)
            if not bool(ok.all()):
                x = torch.where(ok[:, None], x, torch.zeros((), device=x.device))
            outs.append(self.project(x))
            valid.append(ok)
        return torch.cat(outs), torch.cat(valid)

    def _p(self, layer: int) -> str:
        return "layer." if layer == 0 else f"layers.{layer}."

    def _layer_in(self, layer: int, emb: torch.Tensor | None, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(input of the attention projections, residual) of one decoder layer."""
        s, w, p = self.spec, self.w, self._p(layer)
        if layer == 0:
            hn = rms_norm(h, w["layer.hidden_norm.weight"], s.rms_norm_eps)
            x = torch.cat([rms_norm(emb, w["layer.input_layernorm.weight"], s.rms_norm_eps), hn], -1)
            return x, (hn if self.norm_before_residual else h)
        return rms_norm(h, w[p + "input_layernorm.weight"], s.rms_norm_eps), h

    def _qkv(self, layer: int, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [heads, B, d], k, v [kv, B, d], rotated at ``pos``."""
        s, w, p = self.spec, self.w, self._p(layer)
        b = x.shape[0]
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(b, s.num_heads, s.head_dim).transpose(0, 1)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(b, s.num_kv_heads, s.head_dim).transpose(0, 1)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(b, s.num_kv_heads, s.head_dim).transpose(0, 1)
        if p + "self_attn.q_norm.weight" in w:  # Qwen3-style per-head norms
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], s.rms_norm_eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], s.rms_norm_eps)
        return _rotate(q, pos, self.inv, self.rope_scale), _rotate(k, pos, self.inv, self.rope_scale), v

    def _layer_out(self, layer: int, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """o_proj + residual, MLP + residual."""
        s, w, p = self.spec, self.w, self._p(layer)
        b = attn.shape[1]
        h = residual + attn.transpose(0, 1).reshape(b, s.num_heads * s.head_dim) @ w[p + "self_attn.o_proj.weight"].T
        m = rms_norm(h, w[p + "post_attention_layernorm.weight"], s.rms_norm_eps)
        return h + (F.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)) \
            @ w[p + "mlp.down_proj.weight"].T

    def _head(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(state fed to the next step, logits over the draft vocabulary)."""
        normed = rms_norm(h, self.w["norm.weight"], self.spec.rms_norm_eps)
        logits = (normed if self.norm_before_head else h) @ self.w["lm_head.weight"].T
        return (normed if self.feed_back_normed else h), logits

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the embedding, widened to float32 (the matrix itself stays as stored)."""
        return self.embed_weight[ids.to(self.device)].to(torch.float32)

    def _attend(self, layer: int, q: torch.Tensor, pre: Prefix, b: int, rows: torch.Tensor,
                own: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Attention of queries q [heads, Q, d] (query i sits at row ``rows[i]``) over the prefix keys 0..b-1 of
        this layer (causal, sliding window, valid rows, same document) and the per-query keys ``own`` [kv, Q, d]."""
        s = self.spec
        k_all, v_all = pre.caches[layer][0][:, :b], pre.caches[layer][1][:, :b]
        n_q, g = q.shape[1], s.num_heads // s.num_kv_heads
        keys = torch.arange(b, device=self.device)
        mask = rows[:, None] >= keys[None, :]
        if layer in self.sliding:
            mask = mask & (keys[None, :] > rows[:, None] - s.sliding_window)
        if pre.valid is not None:
            mask = mask & pre.valid[None, :b]
        if pre.doc is not None:
            mask = mask & (pre.doc[rows][:, None] == pre.doc[None, :b])
        scale = 1.0 / math.sqrt(s.head_dim)
        block = max(1, min(s.num_kv_heads, ATTN_BUDGET // max(1, g * n_q * (b + len(own)))))
        outs = []
        for h0 in range(0, s.num_kv_heads, block):
            h1 = min(s.num_kv_heads, h0 + block)
            qg = q[h0 * g:h1 * g].reshape(h1 - h0, g, n_q, s.head_dim)
            scores = torch.einsum("kgqd,ksd->kgqs", qg, k_all[h0:h1]) * scale
            scores = scores.masked_fill(~mask, float("-inf"))
            extra = [(qg * kk[h0:h1, None]).sum(-1, keepdim=True) * scale for kk, _ in own]
            p = torch.softmax(torch.cat([scores] + extra, -1), -1)
            out = torch.einsum("kgqs,ksd->kgqd", p[..., :b], v_all[h0:h1])
            for i, (_, vv) in enumerate(own):
                out = out + p[..., b + i, None] * vv[h0:h1, None]
            outs.append(out.reshape((h1 - h0) * g, n_q, s.head_dim))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    # -- the prefix and one step ----------------------------------------------------------------
    def prefix(self, h0: torch.Tensor, ids: torch.Tensor, *, pos: torch.Tensor | None = None,
               doc: torch.Tensor | None = None, valid: torch.Tensor | None = None, chunk: int | None = None) -> Prefix:
        """Every layer's step-1 keys and values of every row: what the drafter's KV cache holds for the prefix.

        One causal pass over the sequence, layer by layer, in row chunks (a layer's keys of rows before a chunk
        are written before the chunk attends to them).
        """
        s, total = self.spec, h0.shape[0]
        ids = to_torch(ids).to(self.device).long()
        pos = torch.arange(total, device=self.device) if pos is None else pos.to(self.device)
        pre = Prefix(h0, ids, [], pos, None if doc is None else doc.to(self.device),
                     None if valid is None else valid.to(self.device))
        chunk = chunk or self.row_chunk(total)
        nxt = _shift(ids, 1)
        state = h0
        for layer in range(self.layers):
            k_all = h0.new_zeros(s.num_kv_heads, total, s.head_dim)
            v_all = h0.new_zeros(s.num_kv_heads, total, s.head_dim)
            pre.caches.append((k_all, v_all))
            last = layer == self.layers - 1
            outs = []
            for a in range(0, total, chunk):
                b = min(a + chunk, total)
                x, res = self._layer_in(layer, self.embed(nxt[a:b]) if layer == 0 else None, state[a:b])
                q, k, v = self._qkv(layer, x, pos[a:b])
                if pre.valid is not None and not bool(pre.valid[a:b].all()):
                    keep = pre.valid[a:b][None, :, None]
                    k, v = k * keep, v * keep  # a masked row must not carry NaN into a product
                k_all[:, a:b] = k
                v_all[:, a:b] = v
                if not last:
                    attn = self._attend(layer, q, pre, b, torch.arange(a, b, device=self.device), [])
                    outs.append(self._layer_out(layer, attn, res))
            if not last:
                state = torch.cat(outs)
        return pre

    def step(self, pre: Prefix, tokens: torch.Tensor, h: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor,
             b: int, own: Own, self_key: bool) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """One draft step for Q queries: input token ids [Q] and states [Q, H] at rows ``rows`` and rotary ``pos``.

        Each layer attends to its prefix keys 0..b-1, to ``own[layer]`` (keys of the query's earlier steps) and,
        with ``self_key``, to the query's own new key. Returns (state fed back, draft logits, the new (k, v) per layer).
        """
        emb = self.embed(tokens)
        state = h
        new = []
        for layer in range(self.layers):
            x, res = self._layer_in(layer, emb, state)
            q, k, v = self._qkv(layer, x, pos)
            extra = own[layer] + ([(k, v)] if self_key else [])
            state = self._layer_out(layer, self._attend(layer, q, pre, b, rows, extra), res)
            new.append((k, v))
        fb, logits = self._head(state)
        return fb, logits, new

    # -- the chain --------------------------------------------------------------------------
    def chain(self, pre: Prefix, steps: int, a: int, b: int) -> Iterator[torch.Tensor]:
        """Logits [b-a, V_draft] of steps 1..``steps`` for start rows a..b-1, teacher-forced with the prefix's ids."""
        rows = torch.arange(a, b, device=self.device)
        h = pre.h0[a:b]
        own: Own = [[] for _ in range(self.layers)]
        for step in range(1, steps + 1):
            h, logits, new = self.step(pre, _shift(pre.ids, step)[a:b], h, rows, pre.pos[a:b] + step - 1, b, own,
                                       self_key=step > 1)
            if step > 1:
                for layer in range(self.layers):
                    own[layer].append(new[layer])
            yield logits


def _rows_of(aux: torch.Tensor | AuxRows) -> AuxRows:
    if isinstance(aux, torch.Tensor):
        return lambda a, b: aux[a:b]
    return aux


def start_cuda(device: str) -> None:
    """Start creating the CUDA context on a daemon thread (1-3 s on a GPU host) while the caller reads its inputs on
    the CPU; the first CUDA call waits for it (torch's own lazy-init lock). Nothing for another device."""
    if torch.device(device).type != "cuda" or torch.cuda.is_initialized():
        return
    import threading

    def init() -> None:
        try:
            torch.cuda.init()
            torch.empty(1, device=device)  # the context and the caching allocator of that device
        except Exception:  # noqa: BLE001 - the first real CUDA call meets the error again and reports it
            pass
    threading.Thread(target=init, name="eagleforensics-cuda-init", daemon=True).start()


_HEAD_ON_DEVICE: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # device -> (host lm_head, its device copy)


def head_on(lm_head: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """``lm_head`` on ``device`` in its stored dtype, copied there once per head (not per chunk of rows); a
    ``DiskRows`` head stays in its file on the CPU (read a block at a time) and is copied block by block elsewhere."""
    dev = torch.device(device)
    if lm_head.device == dev:
        return lm_head
    key = str(dev)
    held = _HEAD_ON_DEVICE.get(key)
    if held is None or held[0] is not lm_head:
        _HEAD_ON_DEVICE.pop(key, None)  # one head per device: the previous one is freed first
        if isinstance(lm_head, DiskRows):  # from the file, then checked on the device (one pass there)
            moved = lm_head.to(dev)
            if not bool(torch.isfinite(moved).all()):
                raise ForensicsError(f"target tensor {lm_head.name} holds NaN or Inf", path=lm_head.path)
        else:
            moved = lm_head.to(dev)
        _HEAD_ON_DEVICE[key] = (lm_head, moved)
    return _HEAD_ON_DEVICE[key][1]


def head_logits(x: torch.Tensor, head: torch.Tensor, out: torch.Tensor | None = None,
                block: int = HEAD_BLOCK) -> torch.Tensor:
    """``x @ head.T`` in float32 ([n, V]) with the head widened a block of ``block`` vocabulary rows at a time."""
    out = torch.empty(x.shape[0], head.shape[0], device=x.device) if out is None else out
    for v0 in range(0, head.shape[0], block):
        w = head_block(head, v0, v0 + block).to(torch.float32)
        torch.matmul(x, w.T, out=out[:, v0:v0 + w.shape[0]])
    return out


def greedy_rows(final: Callable[[int, int], torch.Tensor], rows: int, lm_head: torch.Tensor,
                device: str = "cpu", row_block: int = GREEDY_ROWS, block: int = HEAD_BLOCK) -> torch.Tensor:
    """The target's greedy next token for rows [0, rows) of ``final`` (post-norm states), -1 where non-finite.

    The lm_head (stored dtype, on ``device`` once) is widened to float32 a block of vocabulary rows at a time and
    each block is multiplied with up to ``row_block`` rows at once: for T <= ``row_block`` the head is widened
    once in all, where a per-chunk conversion widened the whole of it for every 100 rows."""
    head = head_on(lm_head, device)
    out = []
    for a in range(0, rows, row_block):
        x = final(a, min(rows, a + row_block)).to(device, torch.float32)
        n = x.shape[0]
        best = torch.full((n,), -torch.inf, device=x.device)
        arg = torch.zeros(n, dtype=torch.long, device=x.device)
        for v0 in range(0, head.shape[0], block):
            w = head_block(head, v0, v0 + block)
            if isinstance(head, DiskRows) and not all_finite(w):  # read whole, it was checked there
                raise ForensicsError(f"target tensor {head.name} holds NaN or Inf", path=head.path)
            logits = x @ w.to(torch.float32).T
            i = logits.argmax(-1)
            v = logits.gather(1, i[:, None])[:, 0]
            better = v > best  # strict: the first maximum wins, as one argmax over the whole row
            best = torch.where(better, v, best)
            arg = torch.where(better, i + v0, arg)
        out.append(torch.where(torch.isfinite(x).all(-1), arg, torch.full_like(arg, -1)).cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def target_tokens(final_normed: torch.Tensor, lm_head: torch.Tensor, device: str = "cpu",
                  chunk: int = ROW_CHUNK) -> torch.Tensor:
    """The target's greedy next token per row: argmax of its lm_head on the post-norm final state (-1 where non-finite)."""
    return greedy_rows(lambda a, b: final_normed[a:b], final_normed.shape[0], lm_head, device)


def top_p_renorm(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the most likely tokens until their mass reaches ``top_p`` (the token that crosses it included), renormalise."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p
    kept = torch.where(before < top_p, sorted_p, torch.zeros((), device=probs.device))
    out = torch.zeros_like(probs).scatter(-1, order, kept)
    return out / out.sum(-1, keepdim=True)


@dataclass
class TargetSide:
    """The target's side of verification: its final state per row (post-norm) and its lm_head."""

    final: AuxRows  # rows(a, b) -> post-norm final states [b-a, H]
    rows: int
    lm_head: torch.Tensor  # [V, H]
    device: str = "cpu"

    def probs(self, a: int, b: int, temperature: float, top_p: float = 1.0) -> torch.Tensor:
        """Sampling distribution of the target after rows a..b-1 ([b-a, V]; zeros past the end or where non-finite)."""
        head = head_on(self.lm_head, self.device)  # stored dtype; widened a block at a time in head_logits
        out = torch.zeros(b - a, head.shape[0], device=self.device)
        hi = min(b, self.rows)
        if hi > a:
            x = self.final(a, hi).to(self.device, torch.float32)
            ok = torch.isfinite(x).all(-1)
            p = torch.softmax(head_logits(torch.where(ok[:, None], x, torch.zeros((), device=x.device)), head)
                              / temperature, -1)
            out[:hi - a] = top_p_renorm(p, top_p) * ok[:, None]
        return out


def speedup(accept_length: float, steps: int, cost_ratio: float) -> float:
    """Decode speed-up of chain speculation: L tokens per round of ``steps`` draft passes and one verify.

    One round costs ``steps * c + 1`` target forwards (c = draft/verify cost ratio) and yields
    ``L`` tokens on average, against 1 token per target forward without speculation.
    """
    return accept_length / (1.0 + steps * cost_ratio)


# -- replaying one wiring --------------------------------------------------------------------------------------
@dataclass
class ChainRun:
    """Per step k and row t: the draft (target vocabulary), and what sampling/tree figures need."""

    drafts: torch.Tensor  # [S, T] long
    rank: torch.Tensor | None = None  # [S, T]: rank of y[t+k] in the drafter's step-k logits (teacher-forced); V if absent
    alpha_greedy: torch.Tensor | None = None  # [S, T]: p_T(draft), greedy draft verified by sampling
    alpha_sampled: torch.Tensor | None = None  # [S, T]: sum(min(p_T, q_T)), draft sampled from the drafter

    def in_topk(self, topk: int) -> torch.Tensor:
        """[S, T] bool: the target token is among the drafter's ``topk`` most likely at that step."""
        if self.rank is None:
            raise ValueError("replay_chain ran without target tokens")
        return self.rank < topk


def _ahead(y: torch.Tensor, k: int) -> torch.Tensor:
    """y[t + k] at row t, -1 past the end."""
    return torch.cat([y[k:], y.new_full((min(k, y.shape[0]),), -1)])


def replay_chain(fwd: DraftForward, pre: Prefix, steps: int, *, y: torch.Tensor | None = None,
                 target: TargetSide | None = None, temperature: float = 0.0, top_p: float = 1.0,
                 chunk: int | None = None) -> ChainRun:
    """Replay the teacher-forced chain from every start row; with ``target`` and a temperature, the expected
    acceptance of each step under sampling; with ``y``, the rank of the target token in each step's logits."""
    total = pre.rows
    chunk = chunk or fwd.row_chunk(total)
    run = ChainRun(torch.empty(steps, total, dtype=torch.long))
    to_draft = None
    if y is not None:
        run.rank = torch.full((steps, total), fwd.spec.draft_vocab_size, dtype=torch.long)
        to_draft = fwd.target_to_draft()
        y = y.to(fwd.device)
    sampling = target is not None and temperature > 0
    if sampling:
        run.alpha_greedy = torch.zeros(steps, total)
        run.alpha_sampled = torch.zeros(steps, total)
    with torch.no_grad():
        for a in range(0, total, chunk):
            b = min(a + chunk, total)
            for k, logits in enumerate(fwd.chain(pre, steps, a, b), start=1):
                draft = fwd.to_target(logits.argmax(-1))
                run.drafts[k - 1, a:b] = draft.cpu()
                if run.rank is not None and to_draft is not None and y is not None:
                    want = _ahead(y, k)[a:b]
                    d = to_draft[want.clamp(min=0)]
                    ok = (want >= 0) & (d >= 0)
                    mine = logits.gather(1, d.clamp(min=0)[:, None])
                    rank = (logits > mine).sum(-1)
                    run.rank[k - 1, a:b] = torch.where(ok, rank, torch.full_like(rank, fwd.spec.draft_vocab_size)).cpu()
                if sampling and target is not None and run.alpha_greedy is not None and run.alpha_sampled is not None:
                    p = target.probs(a + k, b + k, temperature, top_p)
                    run.alpha_greedy[k - 1, a:b] = p.gather(1, draft[:, None])[:, 0].cpu()
                    q = torch.softmax(logits / temperature, -1)
                    run.alpha_sampled[k - 1, a:b] = torch.minimum(p[:, fwd.draft_ids], q).sum(-1).cpu()
    return run


def replay_drafts(fwd: DraftForward, aux: torch.Tensor | AuxRows, ids: Any, steps: int,
                  chunk: int = ROW_CHUNK) -> torch.Tensor:
    """Drafted target-vocab token ids [steps, T] for every start row (rows near the end hold padding drafts).

    ``aux`` is the [T, k*H] feature tensor or a reader ``rows(a, b)`` of it, so the k*H-wide features are
    only ever held one chunk at a time (T = ``len(ids)``); the fc outputs [T, H] are kept.
    """
    ids = to_torch(ids).long()  # the capture's ids arrive as an array
    with torch.no_grad():
        h0, valid = fwd.project_rows(aux, ids.shape[0], chunk)
        pre = fwd.prefix(h0, ids, valid=None if bool(valid.all()) else valid, chunk=min(chunk, fwd.row_chunk(len(ids))))
    return replay_chain(fwd, pre, steps, chunk=min(chunk, fwd.row_chunk(len(ids)))).drafts


@dataclass(frozen=True)
class TreeCandidates:
    """Every node SGLang scores for a batch of start rows: [rows, C] with C = topk + (steps - 1) topk^2."""

    scores: torch.Tensor  # cumulative probability (product along the path)
    tokens: torch.Tensor  # target-vocabulary token of the node
    parents: torch.Tensor  # index of the parent node in the same row, -1 for the root's children
    depth: torch.Tensor  # 1 .. steps


def tree_candidates(fwd: DraftForward, pre: Prefix, sel: torch.Tensor, steps: int, topk: int) -> TreeCandidates:
    """The nodes SGLang's EAGLE tree scores from start rows ``sel`` (the drafter run node by node on its own tokens).

    Modelled on SGLang 0.5.23 (``srt/speculative/eagle_worker_v2.py`` ``draft_forward``, ``spec_utils.py``
    ``select_top_k_tokens``): the root's ``topk`` most likely tokens are depth 1; at each later step every
    frontier node is expanded by its own ``topk`` (the drafter run on that node's token and its parent's
    state, attending to the prefix and to its ancestors' keys), a child scores parent score x its probability,
    and the ``topk`` best of the ``topk``^2 children become the next frontier.
    """
    kk, nl = topk, fwd.layers
    nb, b = sel.shape[0], int(sel.max()) + 1
    fb, logits, _ = fwd.step(pre, _shift(pre.ids, 1)[sel], pre.h0[sel], sel, pre.pos[sel], b,
                             [[] for _ in range(nl)], self_key=False)
    p, idx = torch.softmax(logits, -1).topk(kk, -1)  # [nb, kk]
    scores, tokens = [p], [fwd.to_target(idx)]
    parents = [torch.full((nb, kk), -1, dtype=torch.long, device=fwd.device)]
    depth = [torch.ones(nb, kk, dtype=torch.long, device=fwd.device)]
    f_tok, f_score, f_index = tokens[0], p, torch.arange(kk, device=fwd.device).expand(nb, kk)
    f_state = fb[:, None].expand(nb, kk, fb.shape[-1])
    f_own: Own = [[] for _ in range(nl)]
    qrows, qpos = sel.repeat_interleave(kk), pre.pos[sel].repeat_interleave(kk)
    seen = kk
    rows_ix = torch.arange(nb, device=fwd.device)[:, None]
    for level in range(2, steps + 1):
        nq = nb * kk
        fb, logits, new = fwd.step(pre, f_tok.reshape(nq), f_state.reshape(nq, -1), qrows, qpos + level - 1, b,
                                   f_own, self_key=True)
        cp, ci = torch.softmax(logits, -1).topk(kk, -1)
        expand = f_score[:, :, None] * cp.view(nb, kk, kk)
        child_tok = fwd.to_target(ci).view(nb, kk * kk)
        scores.append(expand.reshape(nb, kk * kk))
        tokens.append(child_tok)
        parents.append(f_index[:, :, None].expand(nb, kk, kk).reshape(nb, kk * kk))
        depth.append(torch.full((nb, kk * kk), level, dtype=torch.long, device=fwd.device))
        if level < steps:
            f_score, pick = expand.reshape(nb, kk * kk).topk(kk, -1)
            parent = pick // kk  # which frontier node each new frontier node hangs from
            f_tok = child_tok.gather(1, pick)
            f_index = seen + pick
            f_state = fb.view(nb, kk, -1).gather(1, parent[..., None].expand(nb, kk, fb.shape[-1]))
            f_own = [[(ak.view(ak.shape[0], nb, kk, -1)[:, rows_ix, parent].reshape(ak.shape[0], nq, -1),
                       av.view(av.shape[0], nb, kk, -1)[:, rows_ix, parent].reshape(av.shape[0], nq, -1))
                      for ak, av in f_own[layer] + [new[layer]]] for layer in range(nl)]
        seen += kk * kk
    return TreeCandidates(torch.cat(scores, 1), torch.cat(tokens, 1), torch.cat(parents, 1), torch.cat(depth, 1))


def tree_depths(fwd: DraftForward, pre: Prefix, y: torch.Tensor, steps: int, topk: int, draft_tokens: int,
                rows: torch.Tensor | None = None, chunk: int | None = None) -> torch.Tensor:
    """Accepted drafts per start row of SGLang's EAGLE tree, verified greedily against the target tokens ``y``.

    The nodes are ``tree_candidates``; as SGLang 0.5.23's ``eagle_utils.py`` ``organize_draft_results`` does, the
    ``draft_tokens - 1`` best-scored nodes of every level form the tree; greedy verification walks from the root
    to the child whose token is the target's, as long as there is one. ``rows`` (bool [T]) limits the start rows
    evaluated; the others get 0.
    """
    total, kk = pre.rows, topk
    cands = kk + (steps - 1) * kk * kk
    if kk == 1 and draft_tokens != steps + 1:
        raise ForensicsError(f"a chain (topk 1) of {steps} steps verifies {steps + 1} tokens, not {draft_tokens}")
    if draft_tokens < 2 or draft_tokens - 1 > cands:
        raise ForensicsError(f"--draft-tokens {draft_tokens} does not fit a tree of topk {topk} and {steps} steps "
                             f"(2 .. {cands + 1})")
    out = torch.zeros(total, dtype=torch.long)
    chunk = chunk or fwd.row_chunk(total, kk)
    y = y.to(fwd.device)
    starts = torch.arange(total) if rows is None else torch.nonzero(rows.cpu()).flatten()
    with torch.no_grad():
        for i in range(0, starts.shape[0], chunk):
            sel = starts[i:i + chunk].to(fwd.device)
            tree = tree_candidates(fwd, pre, sel, steps, topk)
            keep = torch.zeros_like(tree.scores, dtype=torch.bool)
            keep.scatter_(1, tree.scores.topk(draft_tokens - 1, -1).indices, True)
            cur = torch.full((sel.shape[0],), -1, dtype=torch.long, device=fwd.device)
            alive = torch.ones(sel.shape[0], dtype=torch.bool, device=fwd.device)
            got = torch.zeros(sel.shape[0], dtype=torch.long, device=fwd.device)
            for level in range(1, steps + 1):
                want = _ahead(y, level)[sel]
                match = keep & (tree.parents == cur[:, None]) & (tree.depth == level) \
                    & (tree.tokens == want[:, None]) & (want[:, None] >= 0)
                found = match.any(1) & alive
                cur = torch.where(found, match.float().argmax(1), cur)
                got += found.long()
                alive = found
            out[sel.cpu()] = got.cpu()
    return out


# -- counting --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rows:
    """Which rows count: ``acc[k-1, t]`` for step k at row t (SpecForge's acc_k), ``starts[t]`` for whole chains."""

    acc: torch.Tensor  # [S, T] bool
    starts: torch.Tensor  # [T] bool


def counted_rows(total: int, steps: int, y: torch.Tensor, aux_valid: torch.Tensor | None = None,
                 loss_mask: torch.Tensor | None = None) -> Rows:
    """Step k at row t counts when y[t+k] exists and is finite, row t's aux states are finite and, with a loss
    mask, loss_mask[t+k-1] = 1 (SpecForge 0.2.0 pads the mask left by one row per TTT step,
    ``algorithms/eagle3/model.py``). A chain of ``steps`` starts at row t when every y[t+1..t+steps] exists,
    row t's aux states are finite and, with a loss mask, loss_mask[t] = 1."""
    y = y.cpu()
    ok = torch.ones(total, dtype=torch.bool) if aux_valid is None else aux_valid.cpu().bool()
    mask = None if loss_mask is None else loss_mask.cpu().bool()
    acc = torch.zeros(steps, total, dtype=torch.bool)
    full = ok.clone()
    for k in range(1, steps + 1):
        has = _ahead(y, k) >= 0
        acc[k - 1] = ok & has & (True if mask is None else _ahead(mask.long(), k - 1) > 0)
        full &= has
    starts = full & (True if mask is None else mask)
    return Rows(acc, starts)


def _mean(x: torch.Tensor, where: torch.Tensor) -> float | None:
    n = int(where.sum())
    return None if n == 0 else float(x.double()[where].sum() / n)


@dataclass(frozen=True)
class Scores:
    acc: list[float | None]
    acc_rows: list[int]
    cond: list[float | None]
    reach: list[float | None]
    accept_length: float | None
    starts: int
    per_start: np.ndarray | None = None  # float32 [T]: tokens accepted in the chain from each start row, NaN elsewhere


def score(drafts: torch.Tensor, targets: torch.Tensor, rows: Rows) -> Scores:
    """acc@k over each step's counted rows, reach@k and the accept length over the counted start rows."""
    steps = drafts.shape[0]
    targets = targets.cpu()
    ok = torch.stack([drafts[k - 1] == _ahead(targets, k) for k in range(1, steps + 1)])
    acc = [_mean(ok[k], rows.acc[k]) for k in range(steps)]
    chain = ok.long().cumprod(0)
    reach = [_mean(chain[k], rows.starts) for k in range(steps)]
    per_start = np.where(rows.starts.numpy(), chain.sum(0).numpy().astype(np.float32), np.float32(np.nan))
    return Scores(acc, [int(r.sum()) for r in rows.acc], _cond(reach), reach, _length(reach), int(rows.starts.sum()),
                  per_start)


def _cond(reach: list[float | None]) -> list[float | None]:
    """P(step k accepted | steps 1..k-1 accepted), undefined once no chain survives."""
    out: list[float | None] = [reach[0]]
    for k in range(1, len(reach)):
        prev, cur = reach[k - 1], reach[k]
        out.append(cur / prev if prev and cur is not None else None)
    return out


def _length(reach: list[float | None]) -> float | None:
    return None if any(r is None for r in reach) else 1.0 + sum(r for r in reach if r is not None)


def expected_chain(alpha: torch.Tensor, rows: Rows) -> dict[str, Any]:
    """Per-step expected acceptance (``accept``, over each step's rows), expected reach and accept length of a chain
    whose step k is accepted with probability ``alpha[k-1, t]`` once steps 1..k-1 were."""
    steps = alpha.shape[0]
    accept = [_mean(alpha[k], rows.acc[k]) for k in range(steps)]
    chain = alpha.double().cumprod(0)
    reach = [_mean(chain[k], rows.starts) for k in range(steps)]
    return {"accept": accept, "reach": reach, "accept_length": _length(reach)}


# -- one wiring's result ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WiringReplay:
    """What one wiring gives: per-step acceptance, accept length for a chain of ``steps`` drafts."""

    label: str
    positions: list[Position]
    source: str
    steps: int
    starts: int  # start rows counted for reach@k and the accept length
    acc: list[float | None]  # share of counted rows whose step-k draft equals the target token (SpecForge acc_k)
    cond: list[float | None]  # P(step k accepted | steps 1..k-1 accepted)
    reach: list[float | None]  # P(steps 1..k all accepted) = vLLM's per-position acceptance rate
    accept_length: float | None  # 1 + sum(reach): tokens per verify, bonus token included
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    acc_rows: list[int] = field(default_factory=list)  # rows counted per step for acc@k
    served_without: tuple[str, ...] = ()  # features dropped, as an engine that ignores them serves the drafter
    sampling: dict[str, Any] | None = None  # expected acceptance at a temperature (see ``replay_chain``)
    tree: dict[str, Any] | None = None  # SGLang tree accept length (see ``tree_depths``)
    excluded_rows: int = 0  # rows whose aux states were NaN/Inf (never attended to, never counted)
    # tokens accepted from each start row (float32 [T], NaN where no chain starts): paired differences between wirings
    per_start: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def measured(self) -> bool:
        """False when no row could be counted (NaN/Inf inputs, too few rows): no figure, never a "best" wiring."""
        return self.accept_length is not None

    def speedup(self, cost_ratio: float) -> float | None:
        return None if self.accept_length is None else speedup(self.accept_length, self.steps, cost_ratio)

    def to_dict(self, cost_ratio: float | None = None) -> dict[str, Any]:
        out = {"label": self.label, "positions": [p.label for p in self.positions], "source": self.source,
               "steps": self.steps, "starts": self.starts, "acc": self.acc, "acc_rows": self.acc_rows,
               "cond": self.cond, "reach": self.reach, "accept_length": self.accept_length,
               "note": self.note or None, "measured": self.measured, "excluded_rows": self.excluded_rows,
               "served_without": list(self.served_without), "sampling": self.sampling, "tree": self.tree}
        if cost_ratio is not None:
            out["speedup"] = self.speedup(cost_ratio)
        return out


def replay_wiring(fwd: DraftForward, aux: torch.Tensor | AuxRows, ids: torch.Tensor, targets: torch.Tensor,
                  steps: int, *, label: str, positions: list[Position], source: str, note: str = "",
                  chunk: int | None = None, loss_mask: torch.Tensor | None = None, target: TargetSide | None = None,
                  temperature: float = 0.0, top_p: float = 1.0, topk: int = 1, draft_tokens: int | None = None,
                  served_without: tuple[str, ...] = ()) -> WiringReplay:
    """Replay one wiring's features ([T, k*H] or a row reader) and score the chain against the target tokens.

    ``targets`` holds the target's greedy token after each row (-1 where unknown); ``loss_mask`` limits the
    counted rows as the trainers count acc_k; ``target`` with ``temperature`` > 0 adds the sampling figures;
    ``topk`` > 1 with ``draft_tokens`` adds SGLang's tree.
    """
    if steps < 1:
        raise ForensicsError(f"steps must be at least 1, got {steps}")
    ids = to_torch(ids).long()
    total = ids.shape[0]
    want = fwd.spec.num_aux * fwd.spec.target_hidden_size
    width = _rows_of(aux)(0, 1).shape[-1]
    if width != want:
        raise ForensicsError(f"wiring {label} gives {width} features per token; the drafter's fc reads {want} "
                             f"({fwd.spec.num_aux} states of {fwd.spec.target_hidden_size})")
    with torch.no_grad():
        h0, valid = fwd.project_rows(aux, total, chunk or ROW_CHUNK)
        pre = fwd.prefix(h0, ids, valid=None if bool(valid.all()) else valid, chunk=chunk)
    targets = targets.cpu()
    run = replay_chain(fwd, pre, steps, y=targets, target=target, temperature=temperature, top_p=top_p, chunk=chunk)
    rows = counted_rows(total, steps, targets, valid.cpu(), loss_mask)
    sc = score(run.drafts, targets, rows)
    sampling = None
    if run.alpha_greedy is not None and run.alpha_sampled is not None:
        sampling = {"temperature": temperature, "top_p": top_p,
                    "greedy_drafts": expected_chain(run.alpha_greedy, rows),
                    "sampled_drafts": expected_chain(run.alpha_sampled, rows)}
    tree = None
    if topk > 1 and draft_tokens is not None:
        tree = _tree_summary(fwd, pre, targets, steps, topk, draft_tokens, rows, run, sc, chunk)
    return WiringReplay(label, list(positions), source, steps, sc.starts, sc.acc, sc.cond, sc.reach,
                        sc.accept_length, note, acc_rows=sc.acc_rows, served_without=tuple(served_without),
                        sampling=sampling, tree=tree, excluded_rows=int((~valid).sum()), per_start=sc.per_start)


def _tree_summary(fwd: DraftForward, pre: Prefix, targets: torch.Tensor, steps: int, topk: int, draft_tokens: int,
                  rows: Rows, run: ChainRun, sc: Scores, chunk: int | None) -> dict[str, Any]:
    """The tree's accept length over the counted start rows, beside the chain's and the top-k bound."""
    depth = tree_depths(fwd, pre, targets, steps, topk, draft_tokens, rows.starts, chunk)
    chain = tree_depths(fwd, pre, targets, steps, 1, steps + 1, rows.starts, chunk)  # the same walk, topk 1
    where = rows.starts
    # a target-path node needs its token in its parent's top-k at every level, and a place among the verified nodes
    hit = run.in_topk(topk).long().cumprod(0).sum(0)  # leading steps whose target token is in the drafter's top-k
    bound = _mean(torch.minimum(hit, torch.full_like(hit, draft_tokens - 1)) + 1, where)
    length = _mean(depth + 1, where)
    return {"topk": topk, "draft_tokens": draft_tokens, "steps": steps, "accept_length": length,
            "chain_accept_length": _mean(chain + 1, where), "teacher_forced_chain": sc.accept_length, "bound": bound,
            "depth_share": [_mean((depth >= k).long(), where) for k in range(1, steps + 1)]}
