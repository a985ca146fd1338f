"""An independent fp64 forward of a Qwen2 causal LM (tiny.py's architecture) over one sequence,
and the first-order bound of how far a bf16-autocast evaluation of the same weights may land
from it, per scored token: what the trainer tests' log-prob tolerances are derived from.

Under bf16 autocast (what the trainer runs with bf16=True on the CPU), every linear layer reads
its input, weight and bias rounded to bf16 and writes bf16 (f32 accumulation); the attention
reads q, k, v in bf16 and writes bf16, forming the scores and probabilities in bf16 or f32 (both
are counted: a rounding to bf16 of each); SiLU and the gate's product are bf16 operations; the
residual stream, RMSNorm and the rotary embedding are f32. The fused LM head reads the final
hidden state and its weight rounded to bf16 and accumulates in f32 or better. The weights'
rounding is the same in every evaluation, so the reference uses the rounded weights exactly
(it is not an error). Every other rounding of a value x to a format of unit roundoff u' moves it
by at most u' |x|; a dot product of K terms accumulated in f32 moves by at most K 2^-24 sum |a b|.
To first order the output moves by sum over those points of d out / d x times that rounding:
the reference computes each point's coefficient exactly by differentiating its fp64 forward with
respect to a relative (or, for accumulations, absolute) perturbation there. Two evaluations that
round at the same points (e.g. the replicated batch and the packed group) are each that close to
the fp64 value, so within twice it of each other.
"""
import math

import torch

U = 2.0 ** -8   # bf16's unit roundoff (8 significant bits)
U32 = 2.0 ** -24
NORM = U + 4 * U32  # RMSNorm in f32 (square, mean, rsqrt, scale), then read in bf16


class one_thread:
    """Runs torch on one thread: the reference's many small operations are far slower on two
    (synchronization costs more than they do)."""

    def __enter__(self):
        self.n = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.n)


class _Points:
    """The perturbation points of one forward: (leaf, unit, magnitude or None) triples."""

    def __init__(self):
        self.points = []

    def round(self, x, unit=U):
        """x rounded with unit roundoff `unit`: x (1 + e), e a zero leaf."""
        e = torch.zeros_like(x, requires_grad=True)
        self.points.append((e, unit, None))
        return x * (1 + e)

    def accumulate(self, y, magnitude, terms):
        """y = a sum of `terms` products accumulated in f32: y + d, |d| <= terms 2^-24 magnitude."""
        d = torch.zeros_like(y, requires_grad=True)
        self.points.append((d, terms * U32, magnitude.detach()))
        return y + d

    def bounds(self, outs):
        """bound() of each element of the 1-D `outs` (one batched backward)."""
        m = outs.shape[0]
        leaves = [p[0] for p in self.points]
        grads = torch.autograd.grad(outs, leaves, grad_outputs=torch.eye(m, dtype=outs.dtype),
                                    retain_graph=True, allow_unused=True, is_grads_batched=True)
        l1 = torch.zeros(m, dtype=torch.float64)
        l2 = torch.zeros(m, dtype=torch.float64)
        for (leaf, unit, mag), g in zip(self.points, grads):
            if g is None:
                continue
            c = (unit * (g.abs() if mag is None else g.abs() * mag)).reshape(m, -1)
            l1 += c.sum(1)
            l2 += (c * c).sum(1)
        return torch.stack([l1, l2.sqrt()], 1)

    def bound(self, out):
        """The error coefficients c of `out` (one per rounding point and element: the unit
        roundoff times |d out / d perturbation|, times the magnitude for an accumulation):
        (||c||_1, ||c||_2). To first order the rounding moves `out` by sum_i c_i e_i with every
        |e_i| <= 1."""
        leaves = [p[0] for p in self.points]
        grads = torch.autograd.grad(out, leaves, retain_graph=True, allow_unused=True)
        l1 = l2 = 0.0
        for (leaf, unit, mag), g in zip(self.points, grads):
            if g is None:
                continue
            c = unit * (g.abs() if mag is None else g.abs() * mag)
            l1 += float(c.sum())
            l2 += float((c * c).sum())
        return l1, math.sqrt(l2)


def _bf16(x):
    return x.to(torch.bfloat16).double()


def _rmsnorm(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


class Qwen2:
    """The fp64 reference of a Qwen2ForCausalLM's weights (a {name: tensor} of the model) and its
    config. params "f32" (an f32 model under bf16 autocast): linear weights and biases rounded to
    bf16 as autocast reads them, the embedding and the norms as they are, the residual stream,
    the norms and the rotary embedding in f32. params "bf16" (bf16 parameters, e.g. FSDP's mixed
    precision, under autocast or not): every weight in bf16, the residual stream in bf16 (each
    addition rounded), a norm's f32 result rounded to bf16 and then multiplied by its bf16 weight
    (rounded again), the rotary embedding's cos and sin in bf16 and its two products and their sum
    each rounded."""

    def __init__(self, weights, cfg, params="f32"):
        self.cfg = cfg
        self.bf16 = params == "bf16"
        self.w = {}
        for n, t in weights.items():
            n = n.replace("base_model.model.", "")
            linear = n.endswith("_proj.weight") or n.endswith("_proj.bias") or n == "lm_head.weight"
            self.w[n] = _bf16(t) if linear or self.bf16 else t.double()
        if "lm_head.weight" not in self.w:  # tied
            self.w["lm_head.weight"] = _bf16(self.w["model.embed_tokens.weight"])

    def _linear(self, pt, x, name):
        W = self.w[name + ".weight"]
        y = x @ W.T
        y = pt.accumulate(y, x.abs() @ W.abs().T, W.shape[1])
        b = self.w.get(name + ".bias")
        return pt.round(y if b is None else y + b)

    def forward(self, tokens, positions, labels, temperature):
        """tokens [n] and their positions; labels [n] (-100: not scored), the token each row
        predicts. Returns the Scored rows (those with a label, in order)."""
        cfg, w, pt = self.cfg, self.w, _Points()
        H, Hq, Hkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        D = getattr(cfg, "head_dim", None) or H // Hq
        n = len(tokens)
        eps = cfg.rms_norm_eps
        theta = cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None) \
            else cfg.rope_theta
        inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        ang = positions.double()[:, None] * inv[None]
        cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None]
        sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None]
        if self.bf16:  # the model's cos and sin, in the hidden states' dtype
            cos, sin = _bf16(cos), _bf16(sin)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        residual = U if self.bf16 else U32

        def norm(x, name):
            if self.bf16:
                return pt.round(w[name] * pt.round(_rmsnorm(x, 1.0, eps), NORM))
            return pt.round(_rmsnorm(x, w[name], eps), NORM)

        def rotary(x):
            if self.bf16:
                return pt.round(pt.round(x * cos) + pt.round(_rotate_half(x) * sin))
            return pt.round(x * cos + _rotate_half(x) * sin)

        x = w["model.embed_tokens.weight"][tokens]
        for layer in range(cfg.num_hidden_layers):
            p = "model.layers.%d." % layer
            h = norm(x, p + "input_layernorm.weight")
            q = self._linear(pt, h, p + "self_attn.q_proj").view(n, Hq, D)
            k = self._linear(pt, h, p + "self_attn.k_proj").view(n, Hkv, D)
            v = self._linear(pt, h, p + "self_attn.v_proj").view(n, Hkv, D)
            q = rotary(q)
            k = rotary(k)
            k = k.repeat_interleave(Hq // Hkv, 1)
            v = v.repeat_interleave(Hq // Hkv, 1)
            s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
            s = pt.round(pt.accumulate(s, torch.einsum("qhd,khd->hqk", q.abs(), k.abs()) / math.sqrt(D), D))
            s = s.masked_fill(~causal, -math.inf)
            prob = pt.round(torch.softmax(s, -1))
            o = torch.einsum("hqk,khd->qhd", prob, v)
            o = pt.round(pt.accumulate(o, torch.einsum("hqk,khd->qhd", prob.abs(), v.abs()), n))
            x = pt.round(x + self._linear(pt, o.reshape(n, Hq * D), p + "self_attn.o_proj"), residual)
            h = norm(x, p + "post_attention_layernorm.weight")
            g = self._linear(pt, h, p + "mlp.gate_proj")
            up = self._linear(pt, h, p + "mlp.up_proj")
            m = pt.round(pt.round(torch.nn.functional.silu(g)) * up)
            x = pt.round(x + self._linear(pt, m, p + "mlp.down_proj"), residual)
        hf = norm(x, "model.norm.weight")
        Wh = w["lm_head.weight"]
        z = pt.accumulate(hf @ Wh.T, hf.abs() @ Wh.abs().T, H) / temperature
        rows = (labels != -100).nonzero()[:, 0]
        lp_all = torch.log_softmax(z[rows], -1)
        # the head's outputs are written in f32
        logp = pt.round(lp_all.gather(1, labels[rows][:, None])[:, 0], U32)
        ent = pt.round(-(lp_all.exp() * lp_all).sum(-1), U32)
        return Scored(logp, ent, pt)


class Scored:
    """The scored rows of one reference forward: logp and entropy (fp64, [m]) and the error
    coefficients of what is computed from them."""

    def __init__(self, logp, entropy, points):
        self._logp, self._entropy, self._points = logp, entropy, points
        self.logp, self.entropy = logp.detach(), entropy.detach()

    def bounds(self, which="logp"):
        """[m, 2]: (||c||_1, ||c||_2) of each row's log-prob (or entropy)."""
        key = "_b_" + which
        if not hasattr(self, key):
            setattr(self, key, self._points.bounds(self._logp if which == "logp" else self._entropy))
        return getattr(self, key)

    def functional(self, a):
        """(||c||_1, ||c||_2) of sum_t a_t logp_t (a [m]: to first order, the rounding of any
        function of the log-probs whose gradient in them is a)."""
        return self._points.bound((a.double() * self._logp).sum())
