"""Target agreement: were a record's supervised tokens written by this target? Read from the record's own final state.

At every supervised position (``loss_mask[t+1] == 1``) the record's final state ``h_t`` gives the
target's next-token distribution ``p_t = softmax(lm_head(norm(h_t)))`` (the norm only when the
state is raw: ``final_state_kind`` decides by content). Against the token the record holds next,
``x = input_ids[t+1]``, each position gives:

* greedy agreement: ``argmax p_t == x``;
* ``log p_t(x)`` and whether ``x`` is outside the target's top 5;
* the **surprise** ``-log p_t(x) - H(p_t)``: how much more surprising ``x`` is than a token the
  target itself samples at temperature 1 (whose expected surprisal is the entropy ``H``). Tokens
  the target sampled at T <= 1 (greedy included, top-k/top-p too) have a mean surprise <= 0;
  text written by anyone else scores the excess cross-entropy over the target's own samples,
  a KL divergence that does not shrink with more data. ``Var_p(log p)`` gives the z-score of
  the sum under "sampled from the target at T = 1", so short records are judged by their noise.

The lm_head is read from the target's safetensors a vocabulary chunk at a time (``io.modeldir``),
so memory stays bounded for a 128k vocabulary: one chunk of rows in float32 plus a [tokens, chunk]
logits block. Sums (``Agreement``) merge across records and scan workers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..arrays import as_array, f32
from ..errors import ForensicsError
from ..io.modeldir import ModelDir
from ..process import usable_cores
from .scoresums import finish_scores
from ..evidence.norms import looks_post_norm, token_norms

HEAD_CHUNK_BYTES = 32 * 1024 * 1024  # float32 bytes of one chunk of lm_head rows
LOGIT_BLOCK = 4 * 1024 * 1024  # logits held at once: [tokens, chunk rows] float32 (a few temporaries of this size)
# families whose RMSNorm multiplies by (1 + weight) (transformers' Gemma*RMSNorm, Qwen3NextRMSNorm)
ONE_PLUS_GAIN = ("gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "qwen3_next")
POST_NORM_LOG_RMS = 0.05  # |log rms(x / gain)| of a post-norm state: 0 up to bf16 rounding and eps

# The decision (README "Target agreement", calibrated by scripts/calibrate_agreement.py):
SURPRISE_MAX = 0.25  # nats per token above the target's own T=1 samples
Z_MIN = 4.0  # ... and that far from chance under "sampled from the target"
PIT_BINS = 10  # the shape test: a histogram of where each token falls in the target's distribution ...
SHAPE_CHI2 = 33.7  # ... whose chi-square against flat (9 degrees of freedom) exceeds this (p = 1e-4) ...
SHAPE_PER_TOKEN = 0.01  # ... and is at least this large per token (an effect, not just a large sample)
SHAPE_MIN_TOKENS = 5 * PIT_BINS  # the chi-square needs about 5 expected tokens a bin; fewer: no shape test
# greedy decoding (temperature 0) is a hypothesis of its own: tokens that are (nearly) all the target's argmax
# are what it writes, whatever the PIT at the lowest fitted temperature looks like (at T = 0.05 a small
# model's top token can still hold only half the mass, so its own greedy text failed the shape test)
GREEDY_AGREEMENT = 0.98
# greedy decoding under numeric noise (data regenerated in another precision, batch-dependent kernels): near-ties
# broken the other way. At least NOISY_GREEDY_AGREEMENT argmax tokens, and GREEDY_AGREEMENT of all tokens the argmax
# or within NEAR_TIE nats of it, is greedy text too (calibrated: docs/calibration.md, scripts/calibrate_agreement.py;
# a tiny DeepSeek-V3 target's greedy answers regenerated in bf16 flip ties of up to 0.8 nats)
NOISY_GREEDY_AGREEMENT = 0.9
NEAR_TIE = 1.0
MIN_TOKENS = 16  # fewer supervised tokens: no verdict
# temperatures at which the likelihood of the data is computed: the best fit says how peaked the source sampled
TEMPERATURES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.15, 1.3, 1.5, 1.75, 2.0)


@dataclass(frozen=True)
class HeadSpec:
    """Where the target's lm_head and final norm live and how the norm is applied (small: shipped to scan workers)."""

    path: str
    head: str
    norm: str | None
    eps: float
    gain_offset: float  # 1.0 where the norm multiplies by (1 + weight)
    softcap: float | None  # final_logit_softcapping
    vocab: int
    hidden: int


def head_spec(model: ModelDir) -> HeadSpec:
    """Find the lm_head (or the tied embedding) and the final norm of a target directory; bad input is one line."""
    text = model.text
    head = model.find("lm_head")
    if head is None and (text.get("tie_word_embeddings") or model.config.get("tie_word_embeddings")):
        head = model.find("embed")
    if head is None:
        raise ForensicsError("no lm_head.weight (nor a tied embedding) in the target's safetensors: cannot compute "
                             "the target's next-token distribution", path=model.path)
    info = model.info(head)
    if len(info.shape) != 2:
        raise ForensicsError(f"{head} has shape {list(info.shape)}; expected [vocab, hidden]", path=model.path)
    norm = model.find("norm")
    if norm is not None and model.info(norm).shape != (info.shape[1],):
        raise ForensicsError(f"{norm} has shape {list(model.info(norm).shape)}; the lm_head reads {info.shape[1]} "
                             "features", path=model.path)
    eps = next((float(text[k]) for k in ("rms_norm_eps", "layer_norm_eps", "norm_epsilon", "layer_norm_epsilon")
                if isinstance(text.get(k), (int, float)) and not isinstance(text.get(k), bool)), 1e-6)
    mtype = str(text.get("model_type") or model.config.get("model_type") or "")
    cap = text.get("final_logit_softcapping")
    return HeadSpec(str(model.path), head, norm, eps, 1.0 if mtype in ONE_PLUS_GAIN else 0.0,
                    float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0 else None,
                    int(info.shape[0]), int(info.shape[1]))


@dataclass
class TokenScores:
    """Per supervised position: greedy agreement, log p of the next id, its rank, the entropy, Var_p(log p), and at
    each temperature of ``TEMPERATURES`` the log-likelihood of the next id and the probability of the top id."""

    agree: np.ndarray  # bool [T]
    logp: np.ndarray  # float64 [T]
    rank: np.ndarray  # int64 [T]: how many ids the target rates strictly higher
    entropy: np.ndarray  # float64 [T]
    var: np.ndarray  # float64 [T]
    loglik_t: np.ndarray  # float64 [T, G]: log q_T(next id), q_T = softmax(logits / T)
    top1_t: np.ndarray  # float64 [T, G]: q_T(argmax)
    pit_t: np.ndarray  # float64 [T, G]: randomised PIT, q_T(ids rated above) + U q_T(next id): uniform for own samples

    @classmethod
    def empty(cls, t: int) -> "TokenScores":
        g = len(TEMPERATURES)
        return cls(np.zeros(t, bool), np.zeros(t), np.zeros(t, np.int64), np.zeros(t), np.zeros(t), np.zeros((t, g)),
                   np.zeros((t, g)), np.zeros((t, g)))

    def __len__(self) -> int:
        return int(self.agree.shape[0])

    def take(self, a: int, b: int) -> "TokenScores":
        return TokenScores(self.agree[a:b], self.logp[a:b], self.rank[a:b], self.entropy[a:b], self.var[a:b],
                           self.loglik_t[a:b], self.top1_t[a:b], self.pit_t[a:b])


class TargetHead:
    """The target's final norm and lm_head as a scorer of [T, H] final states against next ids."""

    def __init__(self, spec: HeadSpec, model: ModelDir | None = None, device: str = "cpu") -> None:
        self.spec = spec
        self.device = device  # "cpu": numpy; else the lm_head products run there (dataaudit.agreement_torch)
        self.model = model if model is not None else ModelDir(spec.path, "target directory")
        gain = None
        if spec.norm is not None:
            gain = f32(as_array(self.model.read(spec.norm)), copy=True).reshape(-1) + np.float32(spec.gain_offset)
        self.gain = gain

    # ------------------------------------------------------------------ the final state
    def state_kind(self, x: Any) -> tuple[bool, str]:
        """(post_norm, why) for a record's final state [S, H] (its real rows), decided by content.

        With the target's norm gain: a post-norm state is ``gain * x / rms(x)``, so ``x / gain`` has unit
        RMS on every token (to bf16 rounding); a raw state has no reason to. Without a norm tensor: the
        per-token norm spread (``norms.looks_post_norm``)."""
        x = f32(as_array(x))
        if self.gain is None:
            post = looks_post_norm(token_norms(x))
            return post, f"per-token norms {'nearly constant' if post else 'vary'} (no final norm tensor to test against)"
        g = np.where(np.abs(self.gain) > 1e-12, self.gain, np.float32(1.0))
        rms = np.sqrt(np.mean(np.square(x / g, dtype=np.float64), axis=-1))
        ok = np.isfinite(rms) & (rms > 0)
        if not ok.any():
            return False, "no usable rows"
        dev = np.abs(np.log(rms[ok]))
        post = bool(np.median(dev) < POST_NORM_LOG_RMS and np.quantile(dev, 0.9) < 2 * POST_NORM_LOG_RMS)
        return post, (f"x / norm gain has RMS {float(np.median(rms[ok])):.3f} (median over tokens): "
                      + ("post-norm" if post else "raw, the target's norm applied"))

    def normalize(self, x: Any) -> np.ndarray:
        """The target's final RMSNorm of raw states [T, H] (float32)."""
        x = f32(as_array(x))
        with np.errstate(over="ignore", invalid="ignore"):
            inv = 1.0 / np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True) + self.spec.eps)
        y = (x * inv.astype(np.float32))
        return y * self.gain if self.gain is not None else y

    # ------------------------------------------------------------------ scoring
    def _true_logits(self, x: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """x_t . W[next_t] in float64, reading only the rows of the ids that occur."""
        uniq, inverse = np.unique(nxt, return_inverse=True)
        rows = f32(as_array(self.model.rows(self.spec.head, uniq)))
        z = np.einsum("th,th->t", x.astype(np.float64), rows[inverse].astype(np.float64))
        return self._cap(z)

    def _cap(self, z: np.ndarray) -> np.ndarray:
        cap = self.spec.softcap
        return z if cap is None else cap * np.tanh(z / cap)

    def score(self, x: Any, next_ids: Any) -> TokenScores:
        """Score normalised final states [T, H] (as the lm_head reads them) against the ids that follow them."""
        x = f32(as_array(x))
        nxt = np.asarray(as_array(next_ids), dtype=np.int64).reshape(-1)
        t, h = x.shape if x.ndim == 2 else (0, 0)
        if x.ndim != 2 or h != self.spec.hidden or t != nxt.shape[0]:
            raise ForensicsError(f"final state of shape {list(x.shape)} and {nxt.shape[0]} next ids do not fit the "
                                 f"target's lm_head [{self.spec.vocab}, {self.spec.hidden}]")
        if t and (nxt.min() < 0 or nxt.max() >= self.spec.vocab):
            raise ForensicsError(f"token id {int(nxt.max())} is outside the target's vocabulary of {self.spec.vocab}: "
                                 "the record was tokenized for another model")
        out = TokenScores.empty(t)
        if not t:
            return out
        ztrue = self._true_logits(x, nxt)
        if self.device != "cpu":  # the same pass on a torch device (dataaudit.agreement_torch), all tokens at once
            from .agreement_torch import score_block

            score_block(self, x, nxt, ztrue, out, self.device, TEMPERATURES)
            return out
        chunk = max(1, min(self.spec.vocab, HEAD_CHUNK_BYTES // (4 * h)))
        block = max(1, min(t, LOGIT_BLOCK // chunk))
        for a in range(0, t, block):
            b = min(t, a + block)
            self._score_block(x[a:b], nxt[a:b], ztrue[a:b], chunk, out.take(a, b))
        return out

    def _score_block(self, x: np.ndarray, nxt: np.ndarray, ztrue: np.ndarray, chunk: int, out: TokenScores) -> None:
        """One pass over the vocabulary for a block of tokens: running max, log-sum-exp and moments, rank."""
        n = x.shape[0]
        m = np.full(n, -np.inf)
        centre: np.ndarray | None = None
        s0 = np.zeros(n)
        s1 = np.zeros(n)
        s2 = np.zeros(n)
        above = np.zeros(n, np.int64)
        inv_t = 1.0 / np.asarray(TEMPERATURES)
        st = np.zeros((n, inv_t.size))  # sum of exp((z - m) / T) per temperature
        sa = np.zeros((n, inv_t.size))  # the same over the ids rated above the next id
        zt32 = ztrue.astype(np.float32)
        rows = np.arange(n)
        buf: np.ndarray | None = None
        for v0 in range(0, self.spec.vocab, chunk):
            v1 = min(self.spec.vocab, v0 + chunk)
            w = self.model.row_block(self.spec.head, v0, v1, out=buf)
            buf = w if buf is None else buf
            z = x @ f32(w).T  # [n, c] float32
            if self.spec.softcap is not None:
                z = self._cap(z).astype(np.float32)
            own = (nxt >= v0) & (nxt < v1)
            gt = z > zt32[:, None]
            if own.any():  # the next id's own column never counts against it (GEMM vs dot rounding)
                gt[rows[own], nxt[own] - v0] = False
            above += gt.sum(1)
            cm = z.max(1).astype(np.float64)
            new = np.maximum(m, cm)
            if centre is None:
                centre = new.copy()
            scale = np.exp(m - new)
            shift = (z - new[:, None].astype(np.float32))  # <= 0

            def at(g: int, shift: np.ndarray = shift) -> None:  # one temperature's sums: columns g of st and sa only
                k = float(inv_t[g])
                rescale = np.exp((m - new) * k)
                e_t = np.exp(shift * np.float32(k))
                st[:, g] = st[:, g] * rescale + e_t.sum(1, dtype=np.float64)
                e_t *= gt
                sa[:, g] = sa[:, g] * rescale + e_t.sum(1, dtype=np.float64)
            _each(at, inv_t.size, shift.size)
            del shift, at  # the block's [n, c] float32 is freed before the next one is made
            z -= centre[:, None].astype(np.float32)  # d = z - centre, in place
            e = np.exp(z - (new - centre)[:, None].astype(np.float32))
            s0 = s0 * scale + e.sum(1, dtype=np.float64)
            e *= z
            s1 = s1 * scale + e.sum(1, dtype=np.float64)
            e *= z
            s2 = s2 * scale + e.sum(1, dtype=np.float64)
            m = new
        finish_scores(m, centre, s0, s1, s2, above, st, sa, ztrue, nxt, out, inv_t)


_POOL: list[Any] = []  # the threads of the temperature scan, started on first use
PARALLEL_MIN = 1 << 16  # logits in a block below which the temperatures run in this thread


def _each(fn: Any, count: int, size: int) -> None:
    """``fn(g)`` for g < count, on threads when the block is large: numpy's exp and sums release the GIL, and each
    g writes only its own columns, so the sums are exactly those of the plain loop, in a fraction of the time."""
    workers = min(count, usable_cores())
    if size < PARALLEL_MIN or workers < 2:
        for g in range(count):
            fn(g)
        return
    if not _POOL:
        from concurrent.futures import ThreadPoolExecutor

        _POOL.append(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="eagleforensics-temperature"))
    list(_POOL[0].map(fn, range(count)))


def supervised_positions(loss_mask: Any, real: int, limit: int | None = None, *, input_ids: Any = None,
                         skip_ids: frozenset[int] = frozenset(), skip: Any = None) -> np.ndarray:
    """Positions t < real - 1 whose next token is a supervised answer token, at most ``limit``, evenly spread.

    Left out, because the renderer wrote them, not the model: the last token of every supervised run (the
    end of turn, appended even to a response cut at max_tokens), next tokens in ``skip_ids`` (template
    control tokens) and positions whose next token is marked in ``skip`` (bool [S], e.g. an empty think
    block the template injected at the start of an answer)."""
    mask = np.asarray(as_array(loss_mask)).reshape(-1)[:real] != 0
    last = mask.copy()  # the last token of a run that ends before the record does
    last[:-1] &= ~mask[1:]
    last[-1:] = False
    keep = np.zeros(mask.shape[0], bool)
    keep[:-1] = mask[1:] & ~last[1:]
    if input_ids is not None and skip_ids:
        ids = np.asarray(as_array(input_ids)).reshape(-1)[:mask.shape[0]]
        keep[:-1] &= ~np.isin(ids[1:], np.fromiter(skip_ids, np.int64))
    if skip is not None:
        sk = np.asarray(skip, bool).reshape(-1)[:mask.shape[0]]
        keep[:-1] &= ~sk[1:]
    pos = np.flatnonzero(keep)
    if limit is not None and pos.size > limit:
        pos = pos[np.linspace(0, pos.size - 1, limit).round().astype(np.int64)]
    return pos


def _zeros() -> tuple[float, ...]:
    return (0.0,) * len(TEMPERATURES)


def _add(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(x + y for x, y in zip(a, b))


def _no_pit() -> np.ndarray:
    return np.zeros((len(TEMPERATURES), PIT_BINS), np.int64)


@dataclass
class Agreement:
    """Sums over scored tokens (merge records and workers with ``+``); the figures and the verdict derive from them.

    Two tests, each against "the target sampled these tokens at some temperature <= 1 (greedy included)":

    * **surprise**: the tokens are less likely than the target's own samples at T = 1 (mean surprise above
      ``SURPRISE_MAX`` nats/token and z above ``Z_MIN``): flatter than anything the target writes;
    * **shape**: at the temperature that best explains how likely the tokens are (``fitted_temperature``, a
      maximum-likelihood fit on ``TEMPERATURES``), where each token falls in the target's distribution
      (its randomised PIT) is not uniform, as it is for the target's own samples (chi-square over
      ``PIT_BINS`` bins above ``SHAPE_CHI2`` and ``SHAPE_PER_TOKEN`` per token): as confident as the target,
      but choosing differently (another model's or the pre-fine-tune model's answers, in-domain human text).
      Not applied below ``SHAPE_MIN_TOKENS`` tokens (the chi-square is not yet valid), nor when at least
      ``GREEDY_AGREEMENT`` of the tokens are the target's argmax: greedy decoding explains them.
    """

    tokens: int = 0
    agree: int = 0
    logp: float = 0.0
    outside_top5: int = 0
    surprise: float = 0.0  # sum of (-log p - H)
    var: float = 0.0  # sum of Var_p(log p)
    entropy: float = 0.0
    loglik_t: tuple[float, ...] = field(default_factory=_zeros)  # per temperature: sum of log q_T(next id)
    top1_t: tuple[float, ...] = field(default_factory=_zeros)  # per temperature: sum of q_T(top id)
    pit: np.ndarray = field(default_factory=_no_pit)  # [temperatures, PIT_BINS] token counts
    near_tie: int = 0  # tokens not the argmax but within NEAR_TIE nats of it (a tie numeric noise may break)

    @classmethod
    def of(cls, s: TokenScores) -> "Agreement":
        if not len(s):
            return cls()
        bins = np.minimum((s.pit_t * PIT_BINS).astype(np.int64), PIT_BINS - 1)  # [T, G]
        pit = np.stack([np.bincount(bins[:, g], minlength=PIT_BINS) for g in range(bins.shape[1])])
        gap = np.log(np.maximum(s.top1_t[:, TEMPERATURES.index(1.0)], 1e-300)) - s.logp  # log p(argmax) - log p(id)
        return cls(len(s), int(s.agree.sum()), float(s.logp.sum()), int((s.rank >= 5).sum()),
                   float((-s.logp - s.entropy).sum()), float(s.var.sum()), float(s.entropy.sum()),
                   tuple(float(v) for v in s.loglik_t.sum(0)), tuple(float(v) for v in s.top1_t.sum(0)),
                   pit.astype(np.int64), int((~s.agree.astype(bool) & (gap <= NEAR_TIE)).sum()))

    def __add__(self, other: "Agreement") -> "Agreement":
        return Agreement(self.tokens + other.tokens, self.agree + other.agree, self.logp + other.logp,
                         self.outside_top5 + other.outside_top5, self.surprise + other.surprise,
                         self.var + other.var, self.entropy + other.entropy, _add(self.loglik_t, other.loglik_t),
                         _add(self.top1_t, other.top1_t), self.pit + other.pit, self.near_tie + other.near_tie)

    def _mean(self, total: float) -> float | None:
        return total / self.tokens if self.tokens else None

    @property
    def agreement(self) -> float | None:
        return self._mean(self.agree)

    @property
    def mean_logprob(self) -> float | None:
        return self._mean(self.logp)

    @property
    def top5_miss(self) -> float | None:
        return self._mean(self.outside_top5)

    @property
    def mean_surprise(self) -> float | None:
        return self._mean(self.surprise)

    @property
    def mean_entropy(self) -> float | None:
        return self._mean(self.entropy)

    @property
    def z(self) -> float | None:
        """The summed surprise in standard deviations of the target's own T=1 samples."""
        if not self.tokens:
            return None
        return self.surprise / math.sqrt(self.var) if self.var > 0 else (math.inf if self.surprise > 0 else 0.0)

    @property
    def _fit(self) -> int:
        return max(range(len(TEMPERATURES)), key=lambda g: self.loglik_t[g])

    @property
    def fitted_temperature(self) -> float | None:
        """The sampling temperature (on ``TEMPERATURES``) under which the target makes these tokens most likely."""
        return TEMPERATURES[self._fit] if self.tokens else None

    @property
    def expected_agreement(self) -> float | None:
        """The greedy agreement the target's own samples at ``fitted_temperature`` would have."""
        return self._mean(self.top1_t[self._fit]) if self.tokens else None

    @property
    def shape_chi2(self) -> float | None:
        """Chi-square of the PIT histogram at ``fitted_temperature`` against flat (``PIT_BINS`` - 1 degrees of freedom)."""
        if not self.tokens:
            return None
        h = self.pit[self._fit].astype(np.float64)
        e = self.tokens / PIT_BINS
        return float(((h - e) ** 2 / e).sum())

    @property
    def reasons(self) -> tuple[str, ...]:
        """Which tests fail: ``surprise`` (flatter than the target's own samples), ``shape`` (other choices)."""
        if self.tokens < MIN_TOKENS:
            return ()
        out = []
        if (self.mean_surprise or 0.0) > SURPRISE_MAX and (self.z or 0.0) > Z_MIN:
            out.append("surprise")
        chi = self.shape_chi2 or 0.0
        greedy = (self.agreement or 0.0) >= GREEDY_AGREEMENT or (
            (self.agreement or 0.0) >= NOISY_GREEDY_AGREEMENT
            and (self.agree + self.near_tie) / self.tokens >= GREEDY_AGREEMENT)
        if not greedy and self.tokens >= SHAPE_MIN_TOKENS and chi > SHAPE_CHI2 and chi > SHAPE_PER_TOKEN * self.tokens:
            out.append("shape")
        return tuple(out)

    @property
    def verdict(self) -> str:
        """``from-target`` / ``not-from-target`` / ``too-few`` (fewer than ``MIN_TOKENS`` scored tokens)."""
        if self.tokens < MIN_TOKENS:
            return "too-few"
        return "not-from-target" if self.reasons else "from-target"

    def to_dict(self) -> dict[str, Any]:
        """The sums and the derived figures, rounded, JSON-ready."""
        def r(v: float | None, n: int = 4) -> float | None:
            return None if v is None or not math.isfinite(v) else round(v, n)

        return {"tokens": self.tokens, "agree": self.agree, "logp_sum": r(self.logp, 3),
                "outside_top5": self.outside_top5, "surprise_sum": r(self.surprise, 3), "var_sum": r(self.var, 3),
                "entropy_sum": r(self.entropy, 3), "loglik_t": [r(v, 3) for v in self.loglik_t],
                "top1_t": [r(v, 3) for v in self.top1_t], "pit": self.pit.tolist(), "near_tie": self.near_tie,
                "agreement": r(self.agreement), "mean_logprob": r(self.mean_logprob), "top5_miss": r(self.top5_miss),
                "mean_entropy": r(self.mean_entropy), "surprise": r(self.mean_surprise), "z": r(self.z, 2),
                "fitted_temperature": self.fitted_temperature, "expected_agreement": r(self.expected_agreement),
                "shape_chi2": r(self.shape_chi2, 2), "reasons": list(self.reasons), "verdict": self.verdict}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Agreement":
        """Back from ``to_dict`` (a scan's results line)."""
        def vec(key: str) -> tuple[float, ...]:
            v = d.get(key)
            return tuple(float(x or 0.0) for x in v) if isinstance(v, list) and len(v) == len(TEMPERATURES) else _zeros()

        pit = _no_pit()
        raw = d.get("pit")
        if isinstance(raw, list):
            try:
                arr = np.asarray(raw, dtype=np.int64)
            except (TypeError, ValueError):
                arr = None
            if arr is not None and arr.shape == pit.shape:
                pit = arr
        return cls(int(d.get("tokens") or 0), int(d.get("agree") or 0), float(d.get("logp_sum") or 0.0),
                   int(d.get("outside_top5") or 0), float(d.get("surprise_sum") or 0.0),
                   float(d.get("var_sum") or 0.0), float(d.get("entropy_sum") or 0.0), vec("loglik_t"), vec("top1_t"),
                   pit, int(d.get("near_tie") or 0))
