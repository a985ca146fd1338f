"""PyTorch baselines for GAE, discounted returns and masked whitening, timed on the GPU beside
tools/rlk-bench-advantage-scan in the same run.

  verl loop        GAE as verl's compute_gae_advantage_return does it: a Python loop over time with
                   [B]-wide tensor ops per step, masked steps skipped (values and the running
                   advantage carried through them).
  openrlhf loop    OpenRLHF's get_advantages_and_returns: values and rewards zeroed under the
                   mask, then the plain reversed loop.
  vectorized       the fastest torch GAE written here, either semantics: a handful of whole-tensor
                   ops. With q = gamma * lambda and c_t the number of steps that count before t
                   (valid steps for verl's skip, every step for zeroed inputs),
                       A_t = sum_{s >= t} q^(c_s - c_t) delta_s,
                   a reversed cumulative sum of q^(c_s - c0) delta_s divided by q^(c_t - c0), in
                   fp64 and in column chunks short enough that the powers stay in range, the next
                   chunk's first advantage carried in with q^(c_end - c_t). verl's next valid value
                   comes from a suffix minimum of valid indices and a gather.
  whitening        verl's masked_whiten (unbiased, +1e-8 in the count and the variance).
  returns          verl's REINFORCE++ loop.

Every baseline is checked against the loops on fresh data before it is timed. Device-event
medians after warm-up; one line per case; JSON with --json. --device cpu runs the same code on
the CPU with wall-clock timing (a smoke test; the figures that matter are on the GPU).
"""
import argparse
import json
import math
import time

import torch

from event_timing import median_min_max, timed


# ---- the trainers' loops --------------------------------------------------------------------

def gae_verl_loop(r, v, m, gamma, lam):
    B, T = r.shape
    next_values = torch.zeros(B, dtype=r.dtype, device=r.device)
    last_gae = torch.zeros(B, dtype=r.dtype, device=r.device)
    rev = []
    for t in reversed(range(T)):
        delta = r[:, t] + gamma * next_values - v[:, t]
        gae_t = delta + gamma * lam * last_gae
        next_values = v[:, t] * m[:, t] + (1 - m[:, t]) * next_values
        last_gae = gae_t * m[:, t] + (1 - m[:, t]) * last_gae
        rev.append(last_gae)
    adv = torch.stack(rev[::-1], dim=1)
    return adv, adv + v


def gae_openrlhf_loop(r, v, m, gamma, lam):
    B, T = r.shape
    v = v * m
    r = r * m
    last_gae = torch.zeros(B, dtype=r.dtype, device=r.device)
    rev = []
    for t in reversed(range(T)):
        next_values = v[:, t + 1] if t < T - 1 else 0.0
        delta = r[:, t] + gamma * next_values - v[:, t]
        last_gae = delta + gamma * lam * last_gae
        rev.append(last_gae)
    adv = torch.stack(rev[::-1], dim=1)
    return adv, adv + v


def returns_reinforce_pp_loop(r, m, gamma):
    B, T = r.shape
    out = torch.zeros_like(r)
    running = torch.zeros(B, dtype=r.dtype, device=r.device)
    for t in reversed(range(T)):
        running = r[:, t] + gamma * running
        out[:, t] = running
        running = running * m[:, t]
    return out


def whiten_verl(x, m, shift_mean=True):
    n = m.sum()
    mean = (x * m).sum() / (n + 1e-8)
    var = (((x - mean) ** 2) * m).sum() / (n + 1e-8) * (n / (n - 1))
    out = (x - mean) * torch.rsqrt(var + 1e-8)
    return out if shift_mean else out + mean


# ---- vectorized GAE ---------------------------------------------------------------------------

def _suffix_discounted(delta, c, q):
    """A_t = sum_{s >= t} q^(c_s - c_t) delta_s per row, fp64, c non-decreasing along t."""
    B, T = delta.shape
    lnq = math.log(q)
    # a chunk spans at most `chunk` counted steps: q^chunk stays far above the fp64 minimum
    chunk = T if lnq == 0.0 else max(1, min(T, int(600.0 / -lnq)))
    out = torch.empty_like(delta)
    carry = None
    for end in range(T, 0, -chunk):
        start = max(0, end - chunk)
        cc = c[:, start:end]
        w = torch.exp((cc - cc[:, :1]) * lnq)
        local = torch.flip(torch.cumsum(torch.flip(delta[:, start:end] * w, [1]), 1), [1]) / w
        if carry is not None:
            a_next, c_next = carry
            local = local + torch.exp((c_next - cc) * lnq) * a_next
        out[:, start:end] = local
        carry = (local[:, :1], cc[:, :1])
    return out


def gae_vectorized(r, v, m, gamma, lam, skip):
    """skip=True: verl's semantics; False: OpenRLHF's (inputs zeroed under the mask)."""
    dt = r.dtype
    r, v, mb = r.double(), v.double(), m.bool()
    md = mb.double()
    B, T = r.shape
    if skip:
        idx = torch.arange(T, device=r.device).expand(B, T)
        cand = torch.where(mb, idx, torch.full_like(idx, T))
        after = torch.flip(torch.cummin(torch.flip(cand, [1]), 1).values, [1])  # min valid index >= t
        nxt = torch.cat([after[:, 1:], torch.full((B, 1), T, device=r.device, dtype=after.dtype)], 1)
        v_pad = torch.cat([v, torch.zeros(B, 1, dtype=v.dtype, device=v.device)], 1)
        next_v = torch.gather(v_pad, 1, nxt)
        delta = md * (r + gamma * next_v - v)
        c = torch.cumsum(md, 1) - md  # valid steps before t
        ret_v = v
    else:
        vz, rz = v * md, r * md
        next_v = torch.cat([vz[:, 1:], torch.zeros(B, 1, dtype=v.dtype, device=v.device)], 1)
        delta = rz + gamma * next_v - vz
        c = torch.arange(T, device=r.device, dtype=torch.float64).expand(B, T)
        ret_v = vz
    adv = _suffix_discounted(delta, c, gamma * lam)
    return adv.to(dt), (adv + ret_v).to(dt)


# ---- timing -----------------------------------------------------------------------------------

def time_ms(fn, warmup, iters, device):
    if device == "cuda":
        return timed(fn, warmup, iters)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return median_min_max(times)


def make_inputs(B, T, device, gen):
    r = torch.randn(B, T, device=device, generator=gen)
    v = torch.randn(B, T, device=device, generator=gen) * 1.5 + 0.5
    lengths = torch.randint(1, T + 1, (B, 1), device=device, generator=gen)
    t = torch.arange(T, device=device).expand(B, T)
    m = (t < lengths) & ((t % 97) >= 5)  # responses with masked tool-output spans inside
    return r, v, m.float()


def check(device, gen):
    """The vectorized forms agree with the loops (fp64, odd shapes, holes, empty rows)."""
    for B, T, gamma, lam in [(5, 37, 1.0, 1.0), (3, 300, 0.99, 0.95), (2, 2000, 1.0, 0.95), (1, 1, 0.9, 0.9)]:
        r, v, m = make_inputs(B, T, device, gen)
        r, v = r.double(), v.double()
        m[0] = 0
        for skip, loop in ((True, gae_verl_loop), (False, gae_openrlhf_loop)):
            a0, r0 = loop(r, v, m, gamma, lam)
            a1, r1 = gae_vectorized(r, v, m, gamma, lam, skip)
            assert torch.allclose(a0, a1, rtol=1e-9, atol=1e-9), (B, T, skip, (a0 - a1).abs().max())
            assert torch.allclose(r0, r1, rtol=1e-9, atol=1e-9), (B, T, skip)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--loop-iters", type=int, default=3, help="timed calls of the Python loops")
    args = ap.parse_args()
    dev = args.device
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)
    check(dev, gen)
    rows = {}
    quick = dev == "cpu"
    for B, T in [(256, 4096), (256, 1024), (8, 20480)]:
        r, v, m = make_inputs(B, T, dev, gen)
        rows[f"torch vectorized gae skip (verl) {B}x{T}"] = time_ms(
            lambda: gae_vectorized(r, v, m, 1.0, 1.0, True), 3 if quick else 20, 5 if quick else 200, dev)
        rows[f"torch vectorized gae zero (OpenRLHF) {B}x{T}"] = time_ms(
            lambda: gae_vectorized(r, v, m, 1.0, 0.95, False), 3 if quick else 20, 5 if quick else 200, dev)
        if not quick or B * T <= 256 * 1024:
            rows[f"torch verl loop gae {B}x{T}"] = time_ms(
                lambda: gae_verl_loop(r, v, m, 1.0, 1.0), 1, args.loop_iters, dev)
    r, v, m = make_inputs(256, 4096, dev, gen)
    rows["torch verl masked_whiten 256x4096"] = time_ms(lambda: whiten_verl(r, m), 3 if quick else 20,
                                                        5 if quick else 200, dev)
    if not quick:
        rows["torch verl REINFORCE++ returns loop 256x4096"] = time_ms(
            lambda: returns_reinforce_pp_loop(r, m, 0.99), 1, args.loop_iters, dev)
    for name, (med, mn, mx) in rows.items():
        print(f"{name:52s} {med:12.5f} {mn:12.5f} {mx:12.5f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                       "torch": torch.__version__,
                       "results": [{"name": k, "median_ms": v[0], "min_ms": v[1], "max_ms": v[2]}
                                   for k, v in rows.items()]}, f, indent=1)


if __name__ == "__main__":
    main()
