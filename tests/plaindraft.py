"""A plain EAGLE-3 drafter forward for the tests: one start row at a time, float64, python loops, no shared code.

It follows the trainers' definitions independently of ``drafter.replay``: rotary as a complex rotation
of (x[i], x[i + d/2]) pairs with transformers' own ``ROPE_INIT_FUNCTIONS`` for the (scaled) frequencies
and the attention factor, attention as an explicit softmax over the prefix rows' step-1 keys and the
query's own earlier keys, every decoder layer written out, sliding windows by row index (speculators'
mask). ``path`` feeds the drafter chosen tokens after step 1 (a tree branch), instead of the record's.
"""
from __future__ import annotations

import math

import torch


def hf_rope(spec) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, attention factor) for the drafter's rotary, from transformers 5.24's own functions."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if spec.rope_scaling is not None:
        params.update({k: v for k, v in spec.rope_scaling.items() if v is not None})
    cfg = LlamaConfig(hidden_size=spec.hidden_size, num_attention_heads=spec.num_heads, head_dim=spec.head_dim,
                      max_position_embeddings=spec.max_position_embeddings or 4096, rope_parameters=params)
    if params["rope_type"] == "default":
        return 1.0 / (spec.rope_theta ** (torch.arange(0, spec.head_dim, 2, dtype=torch.float64) / spec.head_dim)), 1.0
    inv, scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu")
    return inv.double(), float(scale)


def plain_logits(drafter, aux: torch.Tensor, ids: torch.Tensor, t: int, steps: int | None = None,
                 path: list[int] | None = None, drop: frozenset[str] = frozenset(),
                 cache: dict | None = None) -> list[torch.Tensor]:
    """Draft logits of steps 1..k at start row t. Step j >= 2 reads ``path[j-2]`` (target ids) when given, else the
    record's ids[t+j] (teacher forcing); ``steps`` defaults to ``len(path) + 1``. ``cache`` keeps the prefix pass
    of this (drafter, aux, ids, t, drop) between calls (a tree walk asks for many paths from one row)."""
    s = drafter.spec
    w = {k: v.double() if v.is_floating_point() else v for k, v in drafter.weights.items()}
    if "embed_tokens" in drop:
        w["embed"] = w["target_embed"]
    layers = 1 if "num_hidden_layers" in drop else s.num_layers
    sliding = () if "sliding_window" in drop else s.sliding_layers
    head_normed = True if "norm_output" in drop else s.norm_before_head
    feed_normed = False if "norm_output" in drop else s.feed_back_normed
    nbr = s.norm_before_residual and "norm_before_residual" not in drop
    steps = (len(path) + 1) if steps is None else steps
    inv, factor = hf_rope(s)
    d, group = s.head_dim, s.num_heads // s.num_kv_heads

    def norm(x, g):
        return g * x / torch.sqrt((x * x).mean() + s.rms_norm_eps)

    def rot(x, position):
        half = d // 2
        z = torch.complex(x[:half], x[half:]) * torch.exp(1j * position * inv) * factor
        return torch.cat([z.real, z.imag])

    def pre(layer):
        return "layer." if layer == 0 else f"layers.{layer}."

    def fc(r):
        x = aux[r].double()
        if "input_norm.weight" in w and "norm_before_fc" not in drop:
            x = norm(x, w["input_norm.weight"])
        if "fc_norm.0.weight" in w and "fc_norm" not in drop:
            x = torch.cat([norm(c, w[f"fc_norm.{i}.weight"]) for i, c in enumerate(x.chunk(s.num_aux))])
        return w["fc.weight"] @ x

    def layer_input(layer, token, state):
        p = pre(layer)
        if layer == 0:
            hn = norm(state, w["layer.hidden_norm.weight"])
            return torch.cat([norm(w["embed"][token], w["layer.input_layernorm.weight"]), hn]), (hn if nbr else state)
        return norm(state, w[p + "input_layernorm.weight"]), state

    def qkv(layer, x):
        p = pre(layer)
        q, k, v = (w[f"{p}self_attn.{n}_proj.weight"] @ x for n in "qkv")
        if p + "self_attn.q_norm.weight" in w:
            q = torch.cat([norm(c, w[p + "self_attn.q_norm.weight"]) for c in q.split(d)])
            k = torch.cat([norm(c, w[p + "self_attn.k_norm.weight"]) for c in k.split(d)])
        return q, k, v

    def attend(q, position, keys):  # keys: list of (position, k, v)
        heads = []
        for h in range(s.num_heads):
            kv = slice((h // group) * d, (h // group + 1) * d)
            qh = rot(q[h * d:(h + 1) * d], position)
            scores = [float(qh @ rot(kk[kv], pos)) / math.sqrt(d) for pos, kk, _ in keys]
            top = max(scores)
            e = [math.exp(x - top) for x in scores]
            heads.append(sum((wt / sum(e)) * vv[kv] for wt, (_, _, vv) in zip(e, keys)))
        return torch.cat(heads)

    def finish(layer, attn, residual):
        p = pre(layer)
        h = residual + w[p + "self_attn.o_proj.weight"] @ attn
        m = norm(h, w[p + "post_attention_layernorm.weight"])
        gate = w[p + "mlp.gate_proj.weight"] @ m
        return h + w[p + "mlp.down_proj.weight"] @ (gate * torch.sigmoid(gate) * (w[p + "mlp.up_proj.weight"] @ m))

    def visible(layer, row):
        start = row - s.sliding_window + 1 if layer in sliding else 0
        return range(max(0, start), row + 1)

    # step 1 over rows 0..t, layer by layer (each layer's keys of every prefix row)
    if cache is not None and "prefix" in cache:
        prefix, h = cache["prefix"], cache["h"]
    else:
        states = [fc(r) for r in range(t + 1)]
        prefix = []
        for layer in range(layers):
            ins = [layer_input(layer, int(ids[r + 1]), states[r]) for r in range(t + 1)]
            kvs = [qkv(layer, x) for x, _ in ins]
            prefix.append([(r, kvs[r][1], kvs[r][2]) for r in range(t + 1)])
            states = [finish(layer, attend(kvs[r][0], r, [prefix[layer][j] for j in visible(layer, r)]), ins[r][1])
                      for r in range(t + 1)]
        h = states[t]
        if cache is not None:
            cache.update(prefix=prefix, h=h)
    normed = norm(h, w["norm.weight"])
    out = [w["lm_head.weight"] @ (normed if head_normed else h)]
    h = normed if feed_normed else h
    own: list[list] = [[] for _ in range(layers)]
    for step in range(2, steps + 1):
        token = int(ids[t + step]) if path is None else int(path[step - 2])
        state = h
        for layer in range(layers):
            x, res = layer_input(layer, token, state) if layer == 0 else layer_input(layer, None, state)
            q, k, v = qkv(layer, x)
            own[layer].append((t + step - 1, k, v))
            keys = [prefix[layer][j] for j in visible(layer, t)] + own[layer]
            state = finish(layer, attend(q, t + step - 1, keys), res)
        normed = norm(state, w["norm.weight"])
        out.append(w["lm_head.weight"] @ (normed if head_normed else state))
        h = normed if feed_normed else state
    return out
