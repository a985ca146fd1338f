#!/usr/bin/env python3
"""rlk beside PyTorch (and Liger-Kernel where installed), op by op, in one process on one GPU.

    python3 tools/bench/harness.py [--ops a,b] [--quick] [--out-dir DIR] [--json FILE]
                                   [--device cuda|cpu] [--reps N] [--warmup N]

For each op family: a sweep of shapes; for each shape, rlk's call (through the Python package,
zero copy on the current stream) and its PyTorch baselines, which are written from the
descriptions of what trainers run today (verl, TRL, OpenRLHF formulas). Every implementation is
first checked against the first PyTorch baseline on the same inputs. Then they are timed
alternating (the order rotates each round): CUDA events around each call, synchronized, median
of the rounds after warm-up; fresh random inputs for every set of rounds, rotated over several
buffers when one set fits in the 60 MB L2. Peak extra memory is max_memory_allocated() over a
call minus what was allocated before it. The floor is the bytes the op must move at 4.14 TB/s
(specs/performance.md).

Prints a table, writes JSON (--json, default DIR/harness.json) and a PNG chart per op family
(DIR/harness-<family>.png; matplotlib, imported only then). --device cpu runs the same code on
torch CPU tensors and the host backend, wall-clock timed: a smoke test where there is no GPU.
"""
import argparse
import datetime
import importlib
import math
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402

import rlk  # noqa: E402
from torch_advantage_scan import gae_verl_loop, returns_reinforce_pp_loop, whiten_verl  # noqa: E402
from torch_group_advantage import grpo_dict_loop, grpo_vectorized  # noqa: E402
from run_report import git_revision, write_json  # noqa: E402

HBM_TBPS = 4.14  # H200 device-to-device copy, bytes read + written (specs/performance.md)
L2_BYTES = 60 << 20

# ---------------------------------------------------------------------------------------------
# Cases and implementations
# ---------------------------------------------------------------------------------------------


class Impl:
    """One way to compute a case. kind: "rlk", "torch" (a baseline) or "anchor" (another
    library). `fn(inputs)` returns what is compared; `reps`: a cap on timed rounds for slow
    baselines (Python loops); `tol`: how far it may be from the reference, relative to the
    reference's largest magnitude; `view(got, want)`: the parts of both to compare (for an
    anchor that computes a subset); `mutates`: fn overwrites its inputs (its check runs on a
    copy)."""

    def __init__(self, name, kind, fn, reps=None, tol=1e-4, view=None, mutates=False):
        self.name, self.kind, self.fn, self.reps, self.tol = name, kind, fn, reps, tol
        self.view, self.mutates = view, mutates


class Case:
    """One shape of one family: a label, the bytes the op must move (for the floor), a maker
    of fresh inputs, and the implementations (the first torch one is the reference)."""

    def __init__(self, label, nbytes, make, impls, flops=0.0):
        self.label, self.nbytes, self.make, self.impls, self.flops = label, nbytes, make, impls, flops


FAMILIES = {}
SHRINK = 1  # --shrink: every size divided by this (smoke tests on a CPU)
ANCHORS = True  # --no-anchors: leave out other libraries (Liger-Kernel, FlashInfer)


def S(n):
    return max(2, n // SHRINK)


def family(name, title):
    def register(fn):
        FAMILIES[name] = (title, fn)
        return fn
    return register


def rlk_has(op):
    return op in rlk.available_ops()


# ---------------------------------------------------------------------------------------------
# Group advantages
# ---------------------------------------------------------------------------------------------

def _broadcast_torch(scores, mask, G, eps=1e-6):
    adv = grpo_vectorized(scores, G, eps)
    return adv, adv[:, None] * mask


@family("group_advantage", "Group advantages (GRPO), f32")
def group_advantage_cases(dev, quick):
    cases = []
    shapes = [(1024, 16), (16384, 64)] if quick else [(256, 8), (1024, 16), (4096, 16), (16384, 64),
                                                       (65536, 16)]
    for B, G in shapes:
        B = max(G, S(B) // G * G)

        def make(B=B):
            return {"scores": torch.randn(B, device=dev)}
        impls = [
            Impl("torch vectorized", "torch", lambda x, G=G: grpo_vectorized(x["scores"], G)),
            Impl("rlk", "rlk", lambda x, G=G: rlk.group_advantage(x["scores"], G)),
        ]
        if B <= 1024:
            impls.append(Impl("verl dict loop", "torch",
                              lambda x, G=G: grpo_dict_loop(x["scores"], G), reps=5))
        cases.append(Case("B=%d G=%d" % (B, G), 8 * B, make, impls))
    for B, G, T in [(1024, 16, 4096)] if quick else [(256, 16, 2048), (1024, 16, 4096)]:
        B, T = max(G, S(B) // G * G), S(T)
        def make(B=B, T=T):
            lens = torch.randint(T // 4, T + 1, (B, 1), device=dev)
            return {"scores": torch.randn(B, device=dev),
                    "mask": torch.arange(T, device=dev)[None] < lens}
        impls = [
            Impl("torch vectorized", "torch",
                 lambda x, G=G: _broadcast_torch(x["scores"], x["mask"], G)),
            Impl("rlk", "rlk", lambda x, G=G: rlk.group_advantage(x["scores"], G, mask=x["mask"],
                                                                broadcast=True)),
        ]
        cases.append(Case("B=%d G=%d bcast T=%d" % (B, G, T), 8 * B + 5 * B * T, make, impls))
    return cases


# ---------------------------------------------------------------------------------------------
# Policy loss and value loss (fused forward + backward)
# ---------------------------------------------------------------------------------------------

def _padded(B, T, dev):
    lens = torch.randint(T // 4, T + 1, (B, 1), device=dev)
    return torch.arange(T, device=dev)[None] < lens


def _verl_policy_loss(lp, old, ref, adv, mask, clip_low=0.2, clip_high=0.28, dual=3.0,
                      kl_coef=0.001):
    """verl's vanilla PPO loss: clipped ratio with clip-higher, dual clip for A < 0, the
    low-variance KL (k3) clamped as verl does, token-mean over the mask; clip fraction."""
    m = mask.float()
    n = m.sum()
    ratio = torch.exp(torch.clamp(lp - old, -20.0, 20.0))
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    c1 = torch.maximum(l1, l2)
    pg = torch.where(adv < 0, torch.minimum(-adv * dual, c1), c1)
    kl = torch.clamp(ref - lp, -20.0, 20.0)
    k3 = torch.clamp(torch.exp(kl) - kl - 1.0, -10.0, 10.0)
    loss = (pg * m).sum() / n + kl_coef * (k3 * m).sum() / n
    clipfrac = ((l2 > l1).float() * m).sum() / n
    return loss, clipfrac


def _policy_inputs(B, T, dev):
    lp = (torch.randn(B, T, device=dev) * 0.1 - 2.0).requires_grad_(True)
    return {"lp": lp, "old": lp.detach() + torch.randn(B, T, device=dev) * 0.05,
            "ref": lp.detach() + torch.randn(B, T, device=dev) * 0.05,
            "adv": torch.randn(B, T, device=dev), "mask": _padded(B, T, dev)}


def _torch_policy_step(x):
    x["lp"].grad = None
    loss, clipfrac = _verl_policy_loss(x["lp"], x["old"], x["ref"], x["adv"], x["mask"])
    loss.backward()
    return loss.detach(), x["lp"].grad, clipfrac


def _rlk_policy_step(x):
    from rlk.autograd import policy_loss
    x["lp"].grad = None
    loss, metrics = policy_loss(x["lp"], x["old"], x["adv"], x["mask"], ref_logp=x["ref"],
                                kl_coef=0.001, clip_high=0.28, token_normalizer=x["n"])
    loss.backward()
    return loss.detach(), x["lp"].grad, metrics[0]


def _rlk_policy_fused(x):
    out = rlk.policy_loss(x["lp"].detach(), x["old"], x["adv"], x["mask"], ref_logp=x["ref"],
                          kl_coef=0.001, clip_high=0.28, token_normalizer=x["n"])
    return out.loss[0], out.grad_logp, out.metrics[0]


@family("policy_loss", "Policy loss (PPO clip + dual clip + k3 KL, token-mean), f32, fwd+bwd")
def policy_loss_cases(dev, quick):
    if not rlk_has("policy_loss"):
        raise rlk.Unavailable("the loaded librlk has no rlk_policy_loss")
    cases = []
    for B, T in [(1024, 4096)] if quick else [(64, 1024), (256, 2048), (1024, 4096)]:
        B, T = S(B), S(T)
        def make(B=B, T=T):
            x = _policy_inputs(B, T, dev)
            # the global token count a trainer passes in (computed here once, off the clock)
            x["n"] = float(x["mask"].sum())
            return x
        impls = [
            Impl("torch (verl formulas)", "torch", _torch_policy_step),
            Impl("rlk autograd", "rlk", _rlk_policy_step, tol=1e-5),
            Impl("rlk fused call", "rlk", _rlk_policy_fused, tol=1e-5),
        ]
        # lp, old, ref, adv read (f32), the bool mask read, grad written (f32)
        cases.append(Case("B=%d T=%d" % (B, T), B * T * (4 * 4 + 1 + 4), make, impls))
    return cases


def _value_inputs(B, T, dev):
    v = torch.randn(B, T, device=dev).requires_grad_(True)
    x = {"v": v, "vo": v.detach() + torch.randn(B, T, device=dev) * 0.5,
         "R": torch.randn(B, T, device=dev), "mask": _padded(B, T, dev)}
    x["n"] = float(x["mask"].sum())
    return x


def _torch_value_step(x, clip=0.5):
    """verl's clipped value loss, token-mean, and the clip fraction."""
    x["v"].grad = None
    m = x["mask"].float()
    v, vo, R = x["v"], x["vo"], x["R"]
    vc = vo + torch.clamp(v - vo, -clip, clip)
    e1, e2 = (v - R) ** 2, (vc - R) ** 2
    loss = 0.5 * (torch.maximum(e1, e2) * m).sum() / m.sum()
    # The clip fraction in fp64: in f32, vo + (v - vo) rounds away from v for unclipped tokens,
    # and verl's formula then counts some of them as clipped (noise, not clipping).
    vd, vod, Rd = v.detach().double(), vo.double(), R.double()
    vcd = vod + torch.clamp(vd - vod, -clip, clip)
    clipfrac = ((((vcd - Rd) ** 2) > ((vd - Rd) ** 2)).double() * m).sum() / m.sum()
    loss.backward()
    return loss.detach(), v.grad, clipfrac.float()


def _rlk_value_step(x):
    from rlk.autograd import value_loss
    x["v"].grad = None
    loss, metrics = value_loss(x["v"], x["vo"], x["R"], x["mask"], clip=0.5,
                               token_normalizer=x["n"])
    loss.backward()
    return loss.detach(), x["v"].grad, metrics[0]


@family("value_loss", "Value loss (clipped, token-mean), f32, fwd+bwd")
def value_loss_cases(dev, quick):
    if not rlk_has("value_loss"):
        raise rlk.Unavailable("the loaded librlk has no rlk_value_loss")
    out = []
    for B, T in [(1024, 4096)] if quick else [(256, 2048), (1024, 4096)]:
        B, T = S(B), S(T)
        impls = [Impl("torch (verl formulas)", "torch", _torch_value_step),
                 Impl("rlk autograd", "rlk", _rlk_value_step, tol=1e-5)]
        out.append(Case("B=%d T=%d" % (B, T), B * T * (3 * 4 + 1 + 4),
                        lambda B=B, T=T: _value_inputs(B, T, dev), impls))
    return out


# ---------------------------------------------------------------------------------------------
# Token KL estimates
# ---------------------------------------------------------------------------------------------

def _torch_low_var_kl(lp, ref):
    """verl's low_var_kl formulas in torch: exp(ref - lp) - (ref - lp) - 1, clamped."""
    kl = torch.clamp(ref - lp, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def _kl_inputs(B, T, dev):
    lp = (torch.randn(B, T, device=dev) * 0.5 - 2.0).requires_grad_(True)
    return {"lp": lp, "ref": lp.detach() + torch.randn(B, T, device=dev) * 0.3,
            "mask": _padded(B, T, dev)}


def _torch_kl_loss(x):
    x["lp"].grad = None
    kl = _torch_low_var_kl(x["lp"], x["ref"]) * x["mask"]
    kl.backward(torch.ones_like(kl))
    return kl.detach(), x["lp"].grad


def _rlk_kl_loss(x):
    from rlk.autograd import token_kl
    x["lp"].grad = None
    kl = token_kl(x["lp"], x["ref"], "k3", mask=x["mask"])
    kl.backward(torch.ones_like(kl))
    return kl.detach(), x["lp"].grad


@family("token_kl", "Token KL (verl low_var_kl), f32: the rewards' KL, and a KL term fwd+bwd")
def token_kl_cases(dev, quick):
    if not rlk_has("token_kl"):
        raise rlk.Unavailable("the loaded librlk has no rlk_token_kl")
    cases = []
    for B, T in [(S(1024), S(4096))] if quick else [(S(256), S(2048)), (S(1024), S(4096))]:
        impls = [Impl("torch (verl formulas)", "torch",
                      lambda x: _torch_low_var_kl(x["lp"].detach(), x["ref"])),
                 Impl("rlk", "rlk", lambda x: rlk.token_kl(x["lp"].detach(), x["ref"], "k3"), tol=1e-5)]
        # lp, ref read, kl written (f32)
        cases.append(Case("rewards B=%d T=%d" % (B, T), B * T * 12,
                          lambda B=B, T=T: _kl_inputs(B, T, dev), impls))
        impls = [Impl("torch (verl formulas)", "torch", _torch_kl_loss),
                 Impl("rlk autograd", "rlk", _rlk_kl_loss, tol=1e-5)]
        # forward: lp, ref, mask read, kl written; backward: lp, ref, mask, grad_kl read, grad written
        cases.append(Case("loss fwd+bwd B=%d T=%d" % (B, T), B * T * (9 + 4 + 13 + 4),
                          lambda B=B, T=T: _kl_inputs(B, T, dev), impls))
    return cases


# ---------------------------------------------------------------------------------------------
# Advantages and returns over time
# ---------------------------------------------------------------------------------------------

@family("advantage_scan", "GAE, discounted returns, masked whitening, f32")
def advantage_scan_cases(dev, quick):
    cases = []
    shapes = [(S(B), S(T)) for B, T in ([(256, 4096)] if quick else [(256, 1024), (256, 4096)])]

    def make(B, T):
        return {"r": torch.randn(B, T, device=dev), "v": torch.randn(B, T, device=dev),
                "mask": _padded(B, T, dev)}
    if rlk_has("gae"):
        for B, T in shapes:
            impls = [Impl("torch (verl loop)", "torch",
                          lambda x: gae_verl_loop(x["r"], x["v"], x["mask"].float(), 1.0, 0.95), reps=3),
                     Impl("rlk", "rlk", lambda x: rlk.gae(x["r"], x["v"], x["mask"], gamma=1.0,
                                                          lam=0.95), tol=1e-4)]
            cases.append(Case("gae B=%d T=%d" % (B, T), B * T * 17,
                              lambda B=B, T=T: make(B, T), impls))
    if rlk_has("discounted_returns"):
        for B, T in shapes:
            impls = [Impl("torch (verl loop)", "torch",
                          lambda x: returns_reinforce_pp_loop(x["r"], x["mask"].float(), 1.0), reps=3),
                     Impl("rlk", "rlk", lambda x: rlk.discounted_returns(x["r"], x["mask"]))]
            cases.append(Case("returns B=%d T=%d" % (B, T), B * T * 9,
                              lambda B=B, T=T: make(B, T), impls))
    if rlk_has("masked_whiten"):
        for B, T in [(S(1024), S(4096))]:
            impls = [Impl("torch (verl)", "torch", lambda x: whiten_verl(x["r"], x["mask"].float())),
                     Impl("rlk", "rlk", lambda x: rlk.masked_whiten(x["r"], x["mask"]))]
            cases.append(Case("whiten B=%d T=%d" % (B, T), B * T * (4 + 1 + 4 + 4 + 1),
                              lambda B=B, T=T: make(B, T), impls))
    if not cases:
        raise rlk.Unavailable("the loaded librlk has none of gae, discounted_returns, masked_whiten")
    return cases


# ---------------------------------------------------------------------------------------------
# Token log-probs from logits
# ---------------------------------------------------------------------------------------------

V_QWEN = 151936


def _anchor(module):
    """Another library's module for a comparison row: None under --no-anchors or when it does
    not import."""
    if not ANCHORS:
        return None
    try:
        return importlib.import_module(module)
    except Exception:
        return None


def _liger_logp():
    """Liger-Kernel's Triton selective log-softmax (forward only), when installed."""
    liger = _anchor("liger_kernel.ops.grpo_loss")
    if liger is None:
        return None
    fused_selective_log_softmax = liger.fused_selective_log_softmax

    def run(x):
        N, V = x["logits"].shape
        ids = torch.cat([x["labels"][:1], x["labels"][:-1]])[None]  # row l scores ids[l + 1]
        return fused_selective_log_softmax(x["logits"].view(1, N, V), ids, 1.0)[0]
    return run


def _liger_ce():
    """Liger-Kernel's cross entropy (reduction none): -logp, its gradient computed in the
    forward and written over the logits."""
    liger = _anchor("liger_kernel.ops.cross_entropy")
    if liger is None:
        return None
    LigerCrossEntropyFunction = liger.LigerCrossEntropyFunction

    def run(x):
        z = x["logits_g"]
        z.grad = None
        loss = LigerCrossEntropyFunction.apply(z, x["labels"], None, -100, 0.0, 0.0, "sum")[0]
        loss.backward()
        return z.grad
    return run


def _torch_logp_fwdbwd(x):
    z = x["logits_g"]
    z.grad = None
    lp = torch.log_softmax(z.float(), -1).gather(-1, x["labels"][:, None])[:, 0]
    (-lp).sum().backward()
    return z.grad


def _rlk_logp_fwdbwd(x):
    from rlk.autograd import token_logprob
    z = x["logits_g"]
    z.grad = None
    (-token_logprob(z, x["labels"])).sum().backward()
    return z.grad


@family("logprob", "Token log-probs from bf16 logits (V=151936)")
def logprob_cases(dev, quick):
    if not rlk_has("logprob"):
        raise rlk.Unavailable("the loaded librlk has no rlk_logprob")
    V = S(V_QWEN)
    cases = []
    liger_fwd, liger_ce = _liger_logp(), _liger_ce()
    for N in [S(4096)] if quick else [S(4096), S(16384)]:
        def make(N=N):
            return {"logits": torch.randn(N, V, device=dev, dtype=torch.bfloat16),
                    "labels": torch.randint(0, V, (N,), device=dev)}
        fwd = [
            Impl("torch naive log_softmax.gather", "torch",
                 lambda x: torch.log_softmax(x["logits"].float(), -1).gather(
                     -1, x["labels"][:, None])[:, 0]),
            Impl("torch logsumexp-gather", "torch",
                 lambda x: x["logits"].gather(-1, x["labels"][:, None])[:, 0].float()
                 - torch.logsumexp(x["logits"].float(), -1)),
            Impl("torch row-chunked 1024", "torch",
                 lambda x: torch.cat([torch.log_softmax(r, -1).gather(-1, lab[:, None])[:, 0]
                                      for r, lab in zip(x["logits"].split(1024),
                                                        x["labels"].split(1024))]).float(),
                 tol=2e-2),
            Impl("rlk", "rlk", lambda x: rlk.logprob(x["logits"], x["labels"], lse=False).logp),
        ]
        if liger_fwd:
            # Liger scores row l with the id that follows it, so it returns N - 1 rows: the
            # first N - 1 rows of the reference are what it computes.
            fwd.append(Impl("liger fused_selective_log_softmax", "anchor", liger_fwd,
                            view=lambda g, w: (g, w[: g.shape[0]])))
        cases.append(Case("logp fwd N=%d" % N, N * V * 2, make, fwd))

        ent = [
            Impl("torch naive entropy", "torch",
                 lambda x: (lambda z: torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1))(
                     x["logits"].float())),
            Impl("rlk logp+entropy", "rlk",
                 lambda x: rlk.logprob(x["logits"], x["labels"], lse=False, entropy=True).entropy),
        ]
        cases.append(Case("entropy N=%d" % N, N * V * 2, make, ent))

        def make_g(N=N):
            x = make(N)
            x["logits_g"] = x.pop("logits").requires_grad_(True)
            return x
        fb = [Impl("torch naive fwd+bwd", "torch", _torch_logp_fwdbwd),
              Impl("rlk autograd fwd+bwd", "rlk", _rlk_logp_fwdbwd, tol=1e-2)]
        if liger_ce:
            fb.append(Impl("liger cross entropy fwd+bwd", "anchor", liger_ce, tol=1e-2,
                           mutates=True))
        cases.append(Case("logp fwd+bwd N=%d" % N, 3 * N * V * 2, make_g, fb))
    return cases


def _kept_mask(logits, T, k, p):
    """vLLM's filter in fp64: top-k (ties at the k-th value kept), then top-p over the
    renormalized rest (a token stays while the mass above it is below p). The set a sampler may
    draw from; used to check samplers, whose tokens are random."""
    z = logits.double() / T
    keep = torch.ones_like(z, dtype=torch.bool)
    if k:
        keep &= z >= torch.topk(z, k, -1).values[:, -1:]
    if p < 1.0:
        w = torch.softmax(z.masked_fill(~keep, -math.inf), -1)
        sv, si = torch.sort(w, -1, descending=True)
        above = torch.cumsum(sv, -1) - sv
        drop = torch.zeros_like(keep).scatter(-1, si, above >= p * sv.sum(-1, keepdim=True))
        keep &= ~drop | (w >= w.max(-1, keepdim=True).values)
    return keep


def _sample_check(T, k, p):
    """The view of a sampler's output for the check: the fraction of tokens outside the kept set
    (0 for every correct sampler), against the reference's 0."""
    def view(got, want):
        tokens, logits = got
        keep = _kept_mask(logits, T, k, p)
        bad = 1.0 - keep.gather(-1, tokens.long().view(-1, 1)).double().mean()
        return bad.view(1), torch.zeros(1, dtype=torch.float64, device=logits.device)
    return view


def _torch_sort_sample(x, T, k, p):
    """What vLLM-style PyTorch samplers run (shared/anchors/torch_baselines.py): top-k mask, a
    full sort for top-p, multinomial, and the log-prob of the token."""
    logits = x["logits"]
    l = logits / T
    if k:
        l = l.masked_fill(l < torch.topk(l, k, -1).values[:, -1:], -float("inf"))
    if p < 1.0:
        sv, si = torch.sort(l, -1, descending=True)
        pr = torch.softmax(sv, -1)
        sv = sv.masked_fill(torch.cumsum(pr, -1) - pr > p, -float("inf"))
        l = torch.full_like(l, -float("inf")).scatter(-1, si, sv)
    tok = torch.multinomial(torch.softmax(l, -1), 1)[:, 0]
    torch.log_softmax(logits / T, -1).gather(-1, tok[:, None])
    return tok, logits


@family("sample", "Sampling one token per row, f32 logits (V=151936)")
def sample_cases(dev, quick):
    if not rlk_has("sample"):
        raise rlk.Unavailable("the loaded librlk has no rlk_sample")
    V = S(V_QWEN)
    fs = _anchor("flashinfer.sampling")
    cases = []
    for B in [S(256)] if quick else [S(32), S(256)]:
        def make(B=B):
            return {"logits": torch.randn(B, V, device=dev, dtype=torch.float32),
                    "seeds": torch.randint(0, 2**62, (B,), device=dev)}
        filt = [
            Impl("torch sort top-k/top-p", "torch", lambda x: _torch_sort_sample(x, 0.7, 50, 0.9),
                 view=_sample_check(0.7, 50, 0.9)),
            Impl("rlk", "rlk", lambda x: (rlk.sample(x["logits"], temperature=0.7, top_k=50,
                                                     top_p=0.9, seed=x["seeds"]).tokens, x["logits"]),
                 view=_sample_check(0.7, 50, 0.9)),
        ]
        if fs:
            filt.append(Impl("flashinfer top_k_top_p_sampling_from_logits", "anchor",
                             lambda x: (fs.top_k_top_p_sampling_from_logits(x["logits"] / 0.7, 50, 0.9),
                                        x["logits"]),
                             view=_sample_check(0.7, 50, 0.9)))
        cases.append(Case("top-k 50 top-p 0.9 B=%d" % B, B * V * 4, make, filt))
        plain = [
            Impl("torch softmax multinomial", "torch",
                 lambda x: (torch.multinomial(torch.softmax(x["logits"], -1), 1)[:, 0], x["logits"]),
                 view=_sample_check(1.0, 0, 1.0)),
            Impl("rlk", "rlk", lambda x: (rlk.sample(x["logits"], seed=x["seeds"]).tokens, x["logits"]),
                 view=_sample_check(1.0, 0, 1.0)),
        ]
        if fs:
            plain.append(Impl("flashinfer sampling_from_logits", "anchor",
                              lambda x: (fs.sampling_from_logits(x["logits"]), x["logits"]),
                              view=_sample_check(1.0, 0, 1.0)))
        cases.append(Case("temperature 1 B=%d" % B, B * V * 4, make, plain))
    return cases


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


class Clock:
    """Device events on CUDA; wall clock on the CPU."""

    def __init__(self, dev):
        self.cuda = dev.startswith("cuda")

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn):
        if self.cuda:
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            out = fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b), out
        t = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t) * 1e3, out

    def peak_extra(self, fn):
        if not self.cuda:
            return None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        return peak


def _flatten(out):
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flatten(o)]
    return [out] if torch.is_tensor(out) else []


def max_diff(a, b):
    """Largest |a - b| over the outputs, in fp64; inf when the structures differ."""
    fa, fb = _flatten(a), _flatten(b)
    if len(fa) != len(fb):
        return math.inf
    d = 0.0
    for x, y in zip(fa, fb):
        if x.shape != y.shape:
            return math.inf
        x, y = x.detach().reshape(-1), y.detach().reshape(-1)
        for i in range(0, x.numel(), CHUNK):  # in chunks: fp64 copies of [N, V] logits are large
            d = max(d, (x[i:i + CHUNK].double() - y[i:i + CHUNK].double()).abs().max().item())
    return d


def input_bytes(inputs):
    return sum(t.numel() * t.element_size() for t in inputs.values() if torch.is_tensor(t))


def run_case(case, clock, reps, warmup):
    """Checks, warms up, then times every implementation of one case, alternating."""
    ref = next(i for i in case.impls if i.kind == "torch")
    sets = [case.make()]
    nsets = max(1, min(8, math.ceil(2 * L2_BYTES / max(1, input_bytes(sets[0])))))
    sets += [case.make() for _ in range(nsets - 1)]

    rows = {}
    want = ref.fn(sets[0])
    for impl in case.impls:
        row = {"name": impl.name, "kind": impl.kind, "times": [], "error": None}
        rows[impl.name] = row
        try:
            if impl is ref:
                got = want
            else:
                got = impl.fn(_copy(sets[0]) if impl.mutates else sets[0])
            clock.sync()
            g, w = impl.view(got, want) if impl.view else (got, want)
            row["max_abs_diff"] = 0.0 if impl is ref else max_diff(g, w)
            row["agrees"] = row["max_abs_diff"] <= impl.tol * max(1.0, _scale(w))
            del got, g, w
            for _ in range(0 if impl.reps else warmup):
                impl.fn(sets[0])
            clock.sync()
        except Exception as e:  # an anchor that cannot run here is reported, not fatal
            row["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])

    del want
    live = [i for i in case.impls if rows[i.name]["error"] is None]
    block = max(nsets, 5)
    for r in range(reps):
        if r and r % block == 0:
            sets = None
            sets = [case.make() for _ in range(nsets)]  # fresh inputs for the next set of rounds
        order = live[r % len(live):] + live[:r % len(live)] if live else []
        for impl in order:
            if impl.reps and len(rows[impl.name]["times"]) >= impl.reps:
                continue
            ms, out = clock.time(lambda: impl.fn(sets[r % nsets]))
            del out
            rows[impl.name]["times"].append(ms)
    for impl in live:
        row = rows[impl.name]
        row["peak_extra_bytes"] = clock.peak_extra(lambda: impl.fn(sets[0]))
        t = row.pop("times")
        row.update(median_ms=statistics.median(t), min_ms=min(t), max_ms=max(t), runs=len(t))
    for row in rows.values():
        row.pop("times", None)
    return list(rows.values()), nsets


def _copy(inputs):
    out = {}
    for k, v in inputs.items():
        if torch.is_tensor(v):
            c = v.detach().clone()
            out[k] = c.requires_grad_(v.requires_grad) if v.is_leaf else c
        else:
            out[k] = v
    return out


def _scale(out):
    m = 0.0
    for t in _flatten(out):
        t = t.detach().reshape(-1)
        for i in range(0, t.numel(), CHUNK):
            m = max(m, t[i:i + CHUNK].double().abs().max().item())
    return m


CHUNK = 1 << 26


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def floor_ms(case):
    return case.nbytes / (HBM_TBPS * 1e12) * 1e3


def print_table(results):
    hdr = "%-26s %-36s %11s %11s %11s %9s %9s %10s  %s" % (
        "case", "impl", "median ms", "min ms", "max ms", "x floor", "rlk x", "peak MiB", "check")
    print(hdr)
    print("-" * len(hdr))
    for fam in results:
        print("== %s (%s)%s" % (fam["family"], fam["title"],
                                ": skipped: " + fam["skipped"] if fam.get("skipped") else ""))
        for case in fam["cases"]:
            rl = next((r for r in case["impls"] if r["kind"] == "rlk" and not r["error"]), None)
            for r in case["impls"]:
                if r["error"]:
                    print("%-26s %-36s %s" % (case["label"], r["name"], "skipped: " + r["error"]))
                    continue
                speed = (r["median_ms"] / rl["median_ms"]) if rl and r is not rl else None
                peak = r.get("peak_extra_bytes")
                print("%-26s %-36s %11.4f %11.4f %11.4f %9s %9s %10s  %s" % (
                    case["label"], r["name"], r["median_ms"], r["min_ms"], r["max_ms"],
                    "%.1f" % (r["median_ms"] / case["floor_ms"]) if case["floor_ms"] else "-",
                    "%.2f" % speed if speed else "-",
                    "%.1f" % (peak / 2**20) if peak is not None else "-",
                    "ok" if r.get("agrees") else "DIFF %.3g" % r.get("max_abs_diff", math.nan)))
    print("x floor: median / (bytes moved at %.2f TB/s); rlk x: this row's median / rlk's "
          "(how many times faster rlk is)" % HBM_TBPS)


def draw(results, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print("harness: no charts (%s)" % e)
        return []
    paths = []
    for fam in results:
        cases = fam["cases"]
        names = []
        for c in cases:
            for r in c["impls"]:
                if not r["error"] and r["name"] not in names:
                    names.append(r["name"])
        if not names:
            continue
        palette = plt.get_cmap("tab10")
        color = {n: palette(k % 10) for k, n in enumerate(names)}
        floors = all(c["floor_ms"] for c in cases)
        slots = max(len([r for r in c["impls"] if not r["error"]]) for c in cases) + floors
        width = 0.8 / slots
        fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(cases) + 4), 4.8))
        labelled = set()
        for i, c in enumerate(cases):
            rows = [r for r in c["impls"] if not r["error"]]
            x0 = i - 0.4 + width / 2
            for j, r in enumerate(rows):
                lab = r["name"] if r["name"] not in labelled else None
                labelled.add(r["name"])
                ax.bar(x0 + j * width, r["median_ms"], width, color=color[r["name"]], label=lab)
            ours = next((r for r in rows if r["kind"] == "rlk"), None)
            base = [r["median_ms"] for r in rows if r["kind"] != "rlk"]
            if ours and base:  # how many times faster rlk is than the fastest other row
                j = rows.index(ours)
                ax.annotate("%.1fx" % (min(base) / ours["median_ms"]), (x0 + j * width, ours["median_ms"]),
                            ha="center", va="bottom", fontsize=7)
            if floors:
                lab = "floor (bytes at %.2f TB/s)" % HBM_TBPS if i == 0 else None
                ax.bar(x0 + len(rows) * width, c["floor_ms"], width, color="black", label=lab)
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels([c["label"] for c in cases], rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms (median, log scale)")
        ax.set_title("%s - %s" % (fam["title"], fam["device"]), fontsize=10)
        ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1.0), loc="upper left")
        fig.tight_layout()
        path = os.path.join(out_dir, "harness-%s.png" % fam["family"])
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", help="comma-separated op families (default: all): " + ",".join(FAMILIES))
    ap.add_argument("--quick", action="store_true", help="fewer shapes and rounds")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, help="timed rounds per case (default 50, quick 20)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out-dir", default=os.environ.get("OUT") or os.path.join(REPO, "build", "harness"))
    ap.add_argument("--json", help="default: OUT_DIR/harness.json")
    ap.add_argument("--no-charts", action="store_true")
    ap.add_argument("--shrink", type=int, default=1, help="divide every size by this (smoke tests)")
    ap.add_argument("--no-anchors", action="store_true",
                    help="leave out other libraries' rows (Liger-Kernel, FlashInfer: JIT-compiled on first use)")
    args = ap.parse_args(argv)
    global SHRINK, ANCHORS
    SHRINK = max(1, args.shrink)
    ANCHORS = not args.no_anchors

    names = list(FAMILIES) if not args.ops else [s.strip() for s in args.ops.split(",") if s.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        ap.error("unknown op families %s (known: %s)" % (unknown, ", ".join(FAMILIES)))
    reps = args.reps or (20 if args.quick else 50)
    dev = args.device
    clock = Clock(dev)
    os.makedirs(args.out_dir, exist_ok=True)
    if dev.startswith("cuda"):
        if torch.device(dev).index is not None:
            torch.cuda.set_device(torch.device(dev))
        device_name = torch.cuda.get_device_name()
    else:
        device_name = "cpu (host backend; wall clock)"
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))

    print("harness: %s, torch %s, librlk %s (%s), rlk ops: %s" % (
        device_name, torch.__version__, rlk.version_string(), rlk.library_path(),
        " ".join(rlk.available_ops())), flush=True)
    results = []
    for name in names:
        title, make_cases = FAMILIES[name]
        fam = {"family": name, "title": title, "device": device_name, "cases": []}
        results.append(fam)
        try:
            cases = make_cases(dev, args.quick)
        except rlk.RlkError as e:
            print("== %s: skipped: %s" % (name, e), flush=True)
            fam["skipped"] = str(e)
            continue
        for case in cases:
            t0 = time.perf_counter()
            rows, nsets = run_case(case, clock, reps, args.warmup)
            fam["cases"].append({"label": case.label, "bytes": case.nbytes,
                                 "floor_ms": floor_ms(case) if clock.cuda else None,
                                 "input_sets": nsets, "impls": rows})
            print("   %s / %s: %.1f s" % (name, case.label, time.perf_counter() - t0), flush=True)
    print()
    print_table(results)

    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": device_name, "torch": torch.__version__, "rlk": rlk.version_string(),
           "revision": os.environ.get("REV") or git_revision(), "command": " ".join(sys.argv),
           "reps": reps, "warmup": args.warmup, "hbm_tbps": HBM_TBPS, "families": results}
    path = args.json or os.path.join(args.out_dir, "harness.json")
    write_json(path, doc)
    print("harness: wrote %s" % path)
    if not args.no_charts:
        for p in draw(results, args.out_dir):
            print("harness: wrote %s" % p)
    bad = [(f["family"], c["label"], r["name"]) for f in results for c in f["cases"]
           for r in c["impls"] if not r["error"] and not r.get("agrees")]
    if bad:
        print("harness: results that disagree with the reference: %s" % bad)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
