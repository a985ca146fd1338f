"""fp64 numpy references for the tests, written from the op contracts (specs), independent of
the library and of the harness's PyTorch baselines."""
import numpy as np

MODES = ("grpo", "mean-only", "rloo", "batch-std")


def group_advantage(scores, offsets, mode="grpo", eps=1e-6, unbiased=True,
                    singleton="mean0-std1", mask=None, weights=None, nan_scores="propagate"):
    """Advantages [B] for groups [offsets[i], offsets[i+1]). With nan_scores="unscorable" a NaN
    score is left out of every statistic and gets 0."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim == 2:
        m = np.ones_like(s) if mask is None else np.asarray(mask, dtype=np.float64)
        s = np.where(m != 0, s * m, 0.0).sum(axis=1)
    skip = nan_scores == "unscorable"
    ok = ~np.isnan(s) if skip else np.ones(s.shape, bool)
    ddof = 1 if unbiased else 0
    out = np.zeros_like(s)
    sb = s[ok]
    batch_std = sb.std(ddof=ddof) if sb.size > ddof else np.nan
    for lo, hi in zip(offsets[:-1], offsets[1:]):
        idx = np.arange(lo, hi)[ok[lo:hi]]
        g = s[idx]
        n = idx.size
        if mode in ("passk", "passk-unscaled"):
            if n >= 2:
                best = idx[int(np.argmax(g))]  # the first of equal maxima
                second = np.max(s[idx[idx != best]])
                div = g.std(ddof=ddof) + eps if mode == "passk" else 1.0
                out[best] = (s[best] - second) / div
            continue
        if n == 0:
            continue
        if n == 1:
            if singleton == "zero":
                out[idx] = 0.0
            elif mode in ("grpo", "batch-std"):
                out[idx] = g[0] / (1.0 + eps)
            else:
                out[idx] = g[0]
            continue
        mean = g.mean()
        if mode == "grpo":
            out[idx] = (g - mean) / (g.std(ddof=ddof) + eps)
        elif mode == "mean-only":
            out[idx] = g - mean
        elif mode == "rloo":
            out[idx] = g - (g.sum() - g) / (n - 1)
        elif mode == "opo":
            w = np.asarray(weights, dtype=np.float64)[idx]
            out[idx] = g - (w * g).sum() / w.sum()
        else:
            out[idx] = (g - mean) / (batch_std + eps)
    if skip:
        out = np.nan_to_num(out, nan=0.0, posinf=np.inf, neginf=-np.inf)
    return out


def fixed_offsets(B, G):
    return list(range(0, B + 1, G))


def random_offsets(rng, B, max_group=9):
    """Uneven, non-empty groups covering [0, B), with at least one singleton."""
    offs = [0, 1]
    while offs[-1] < B:
        offs.append(min(B, offs[-1] + int(rng.integers(1, max_group + 1))))
    return offs


# ---- policy loss and value loss (fp64, analytic gradients) -------------------------------------

def _tokens(x, seq_offsets):
    """Flat tokens and the sequence of each (-1: outside every sequence)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 2:
        B, T = x.shape
        return x.reshape(-1), np.repeat(np.arange(B), T), B
    seq = np.full(x.shape[0], -1)
    for b, (lo, hi) in enumerate(zip(seq_offsets[:-1], seq_offsets[1:])):
        seq[lo:hi] = b
    return x, seq, len(seq_offsets) - 1


def _agg_coef(x, mask, seq, S, agg, token_normalizer, seq_normalizer, norm_scale, loss_scale):
    """(c_t such that the aggregated loss is sum_t c_t l_t (c_t includes the mask weight), the
    mask weights m_t) for the flat tokens x (_tokens). A normalizer left None is this call's
    count: the mask's sum, or the sequences."""
    m = np.ones_like(x) if mask is None else np.asarray(mask, dtype=np.float64).reshape(-1)
    if token_normalizer is None:
        token_normalizer = np.where(seq >= 0, m, 0).sum()
    if seq_normalizer is None:
        seq_normalizer = S
    m = np.where(seq >= 0, m, 0.0)
    if agg == "token-mean":
        c = m / token_normalizer
    elif agg == "token-sum":
        c = m.copy()
    elif agg == "seq-mean-token-sum":
        c = m / seq_normalizer
    elif agg == "seq-mean-token-mean":
        n = np.zeros(S)
        np.add.at(n, seq[seq >= 0], m[seq >= 0])
        nb = np.where(seq >= 0, n[np.maximum(seq, 0)], 0.0)
        c = np.where(nb != 0, m / np.where(nb != 0, nb, 1.0), 0.0) / seq_normalizer
    else:
        c = m / (seq_normalizer * norm_scale)
    return c * loss_scale, m


def policy_loss(logp, old_logp, adv, mask=None, seq_offsets=None, ref_logp=None, entropy=None,
                is_weights=None, mode="ppo", clip_low=0.2, clip_high=0.2, dual_clip=3.0,
                log_ratio_min=-20.0, log_ratio_max=20.0, tau_pos=1.0, tau_neg=1.05,
                kl="k3", kl_coef=0.0, kl_in=20.0, kl_out=10.0, kl_st=False, entropy_coef=0.0,
                agg="token-mean", token_normalizer=None, seq_normalizer=None, norm_scale=1.0,
                loss_scale=1.0):
    """(loss, grad_logp, grad_entropy, metrics) as the contract of rlk_policy_loss states."""
    shape = np.shape(logp)
    lp, seq, S = _tokens(logp, seq_offsets)
    old = _tokens(old_logp, seq_offsets)[0]
    a = np.asarray(adv, dtype=np.float64)
    if a.ndim == 1 and a.shape[0] != lp.shape[0] or (np.ndim(logp) == 2 and a.ndim == 1):
        A = np.where(seq >= 0, a[np.maximum(seq, 0)], 0.0)
    else:
        A = a.reshape(-1)
    c, m = _agg_coef(lp, mask, seq, S, agg, token_normalizer, seq_normalizer, norm_scale,
                     loss_scale)
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    d = lp - old
    dc = np.clip(d, log_ratio_min, log_ratio_max)
    inside = (d >= log_ratio_min) & (d <= log_ratio_max)
    r = np.exp(dc)
    dr = np.where(inside, r, 0.0)
    clipped = np.zeros_like(lp)
    lower = np.zeros_like(lp)
    if mode in ("ppo", "gspo"):
        if mode == "gspo":
            num = np.zeros(S)
            den = np.zeros(S)
            ok = seq >= 0
            np.add.at(num, seq[ok], (m * d)[ok])
            np.add.at(den, seq[ok], m[ok])
            sl = np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)
            s = np.exp(np.clip(sl, log_ratio_min, log_ratio_max))
            r = np.where(ok, s[np.maximum(seq, 0)], 1.0)
            dr = r.copy()  # straight through: d s / d logp_t = s
        rc = np.clip(r, lo, hi)
        l1, l2 = -A * r, -A * rc
        pg = np.maximum(l1, l2)
        g = np.where(l1 >= l2, -A * dr, -A * dr * ((r >= lo) & (r <= hi)))
        clipped = (l2 > l1).astype(float)
        if mode == "ppo" and dual_clip > 1:
            l3 = -dual_clip * A
            dual = (A < 0) & (pg > l3)
            lower = dual.astype(float)
            pg = np.where(dual, l3, pg)
            g = np.where(dual, 0.0, g)
    elif mode == "cispo":
        rc = np.clip(r, lo, hi)
        pg = -rc * A * lp
        g = -rc * A
        clipped = ((r < lo) | (r > hi)).astype(float)
    elif mode == "sapo":
        tau = np.where(A > 0, tau_pos, tau_neg)
        sig = 1.0 / (1.0 + np.exp(-tau * (r - 1.0)))
        pg = -sig * 4.0 / tau * A
        g = -4.0 * A * sig * (1.0 - sig) * dr
    else:
        pg = -A * lp
        g = -A
    if is_weights is not None:
        w = np.asarray(is_weights, dtype=np.float64).reshape(-1)
        pg, g = pg * w, g * w
    loss = (c * pg).sum()
    grad = c * g
    metrics = {}
    msum = m.sum()

    def mean(x):
        return (m * x).sum() / msum if msum else 0.0
    klv = np.zeros_like(lp)
    if ref_logp is not None:
        e = lp - _tokens(ref_logp, seq_offsets)[0]
        ec = np.clip(e, -kl_in, kl_in)
        gate = np.abs(e) <= kl_in
        f = {"k1": ec, "abs": np.abs(ec), "k2": ec * ec / 2, "k3": np.exp(-ec) + ec - 1}[kl]
        fp = {"k1": np.ones_like(ec), "abs": np.sign(ec), "k2": ec, "k3": 1 - np.exp(-ec)}[kl]
        klv = np.clip(f, -kl_out, kl_out)
        kg = e if kl_st else fp * gate * (np.abs(f) <= kl_out)
        loss += kl_coef * (c * klv).sum()
        grad = grad + kl_coef * c * kg
    ge = None
    ent = np.zeros_like(lp)
    if entropy is not None:
        ent = _tokens(entropy, seq_offsets)[0]
        loss -= entropy_coef * (c * ent).sum()
        ge = (-entropy_coef * c).reshape(shape)
    ok = m != 0
    clipping = mode in ("ppo", "gspo", "cispo")  # the modes that clamp a ratio
    metrics.update(
        clipfrac=mean(clipped), clipfrac_lower=mean(lower),
        clip_low=mean(((r < lo) & (A < 0)).astype(float)) if clipping else 0.0,
        clip_high=mean(((r > hi) & (A > 0)).astype(float)) if clipping else 0.0,
        approx_kl=mean(-dc),
        kl_mean=mean(klv), entropy_mean=mean(ent),
        ratio_max=r[ok].max() if ok.any() else 0.0, ratio_min=r[ok].min() if ok.any() else 0.0,
        pg_loss=(c * pg).sum(), kl_loss=(c * klv).sum(), entropy_loss=(c * ent).sum(),
        mask_sum=msum)
    return loss, grad.reshape(shape), ge, metrics


def value_loss(v, v_old, R, mask=None, seq_offsets=None, clip=0.5, agg="token-mean",
               token_normalizer=None, seq_normalizer=None, norm_scale=1.0, loss_scale=1.0):
    shape = np.shape(v)
    x, seq, S = _tokens(v, seq_offsets)
    xo = _tokens(v_old, seq_offsets)[0]
    ret = _tokens(R, seq_offsets)[0]
    c, m = _agg_coef(x, mask, seq, S, agg, token_normalizer, seq_normalizer, norm_scale,
                     loss_scale)
    delta = x - xo
    vc = xo + np.clip(delta, -clip, clip)
    e1, e2 = (x - ret) ** 2, (vc - ret) ** 2
    inside = (delta >= -clip) & (delta <= clip)
    loss_t = 0.5 * np.maximum(e1, e2)
    g = np.where(e1 >= e2, x - ret, (vc - ret) * inside)
    msum = m.sum()
    # In fp64, v_old + (v - v_old) is v exactly for f32 inputs, so only real clipping counts;
    # rlk computes v_clip = clamp(v, v_old - c, v_old + c), which is v itself inside the range.
    clipped = e2 > e1
    metrics = {"clipfrac": (m * clipped).sum() / msum, "value_mean": (m * x).sum() / msum,
               "error_mean": (m * e1).sum() / msum, "mask_sum": msum}
    return (c * loss_t).sum(), (c * g).reshape(shape), metrics


# ---- advantages and returns over time ----------------------------------------------------------

def gae(r, v, mask, gamma, lam, masked="skip"):
    r = np.asarray(r, np.float64)
    v = np.asarray(v, np.float64)
    m = np.ones_like(r) if mask is None else (np.asarray(mask) != 0).astype(np.float64)
    B, T = r.shape
    adv = np.zeros_like(r)
    ret = np.zeros_like(r)
    for b in range(B):
        if masked == "skip":
            vn = an = 0.0
            for t in reversed(range(T)):
                if m[b, t]:
                    an = r[b, t] + gamma * vn - v[b, t] + gamma * lam * an
                    vn = v[b, t]
                adv[b, t] = an
            ret[b] = adv[b] + v[b]
        else:
            rz, vz = r[b] * m[b], v[b] * m[b]
            an = 0.0
            for t in reversed(range(T)):
                vnext = vz[t + 1] if t + 1 < T else 0.0
                an = rz[t] + gamma * vnext - vz[t] + gamma * lam * an
                adv[b, t] = an
            ret[b] = adv[b] + vz
    return adv, ret


def discounted_returns(r, mask, gamma, masked="reset"):
    r = np.asarray(r, np.float64)
    m = np.ones_like(r) if mask is None else (np.asarray(mask) != 0).astype(np.float64)
    B, T = r.shape
    out = np.zeros_like(r)
    for b in range(B):
        run = 0.0
        for t in reversed(range(T)):
            if masked == "reset":
                carry = m[b, t + 1] * run if t + 1 < T else 0.0
                run = r[b, t] + gamma * carry
            else:
                run = r[b, t] * m[b, t] + gamma * run
            out[b, t] = run
    return out


def reverse_cumsum(x, mask, baseline=None):
    x = np.asarray(x, np.float64)
    m = np.ones_like(x) if mask is None else (np.asarray(mask) != 0).astype(np.float64)
    out = np.flip(np.cumsum(np.flip(x * m, 1), 1), 1)
    if baseline is None:
        return out
    return out, out - np.asarray(baseline, np.float64)[:, None] * m


def masked_whiten(x, mask, eps=1e-8, eps_mode="add", unbiased=True, count_eps=1e-8,
                  shift_mean=True, normalize_std=True, masked="apply"):
    x = np.asarray(x, np.float64)
    valid = np.ones(x.shape, bool) if mask is None else np.asarray(mask) != 0
    n = valid.sum()
    mean = x[valid].sum() / (n + count_eps)
    var = ((x[valid] - mean) ** 2).sum() / (n + count_eps)
    if unbiased:
        var = var * n / (n - 1)
    rstd = 1.0
    if normalize_std:
        rstd = 1.0 / np.sqrt(var + eps if eps_mode == "add" else max(var, eps))
    out = (x - mean) * rstd
    if not shift_mean:
        out = out + mean
    if masked == "zero":
        out = np.where(valid, out, 0.0)
    return out, (mean, var, n)


# ---- token log-probs ----------------------------------------------------------------------------

def logprob(logits, labels, temperature=1.0, ignore_index=-100):
    """(logp, lse, entropy, p, z) in fp64."""
    z = np.asarray(logits, np.float64) / temperature
    mx = z.max(1, keepdims=True)
    e = np.exp(z - mx)
    s = e.sum(1, keepdims=True)
    lse = (mx + np.log(s))[:, 0]
    p = e / s
    lab = np.asarray(labels)
    ok = lab != ignore_index
    logp = np.where(ok, z[np.arange(len(lab)), np.where(ok, lab, 0)] - lse, 0.0)
    ent = lse - (p * z).sum(1)
    return logp, lse, ent, p, z


def logprob_grad(logits, labels, g_lp, g_h, temperature=1.0, ignore_index=-100):
    logp, lse, ent, p, z = logprob(logits, labels, temperature, ignore_index)
    lab = np.asarray(labels)
    ok = lab != ignore_index
    onehot = np.zeros_like(p)
    onehot[np.arange(len(lab))[ok], lab[ok]] = 1.0
    E = (p * z).sum(1, keepdims=True)
    g = np.asarray(g_lp, np.float64)[:, None] * (onehot - p)
    if g_h is not None:
        g = g - np.asarray(g_h, np.float64)[:, None] * p * (z - E)
    return np.where(ok[:, None], g / temperature, 0.0)
