"""One GRPO training step of a real trainer, timed, with its peak memory: TRL's GRPOTrainer as
shipped, with rlk.integrations.trl.patch() (rlk's fused LM head) and with patch(prefix=True) (the
group's prompt processed once: rlk's prefix-shared attention), and verl's use_fused_kernels
forward (verl.models.transformers.dense_common.forward_with_torch_backend) with its
FusedLinearForPPO on verl's torch backend, Liger and rlk, padded, and in the remove-padding layout
(one row, the model's own attention over it: with SDPA a packed mask) without and with
patch(prefix=True).

A step: the old policy's and the reference model's log-prob passes (no gradient), then the policy
update (forward, the trainer's loss, backward, optimizer step) over one GRPO group of G responses
to one prompt. TRL's step goes through GRPOTrainer's own _get_per_token_logps_and_entropies and
compute_loss; verl's through its fused model forward and its registered "vanilla" policy loss
(verl 0.9.1's FSDP engine is not constructed: the forward and loss it calls are).

Models: the Qwen2.5-0.5B and Qwen2.5-1.5B architectures with random weights (nothing downloaded),
bf16 (TRL under bf16 autocast, on the CPU too). A prefix variant's row records which of its passes
ran packed (prefix_calls: "packed", or the reason a pass fell back to the replicated one).
Writes trainer_step.json and trainer_step.png (step time and peak memory per configuration) to
--out-dir (default $OUT, else build/trainer-step/).

    python3 tools/bench/trainer_step.py                       # the full sweep (a GPU)
    python3 tools/bench/trainer_step.py --tiny --device cpu   # a smoke run on the CPU
"""
import argparse
import gc
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402

ARCHS = {
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         tie_word_embeddings=True),
    "tiny": dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True),
}
VARIANTS = ("trl", "trl+rlk", "trl+rlk+prefix", "verl-torch", "verl-liger", "verl-rlk",
            "verl-rlk-rmpad", "verl-rlk-rmpad+prefix", "trl-mb8", "trl-mb4", "trl-mb2")
BETA = 0.04


def model_dir(arch, work):
    """The architecture with random weights, saved (TRL loads its reference model by path)."""
    import transformers
    path = os.path.join(work, arch)
    if not os.path.isdir(path):
        cfg = transformers.Qwen2Config(max_position_embeddings=8192, **ARCHS[arch])
        torch.manual_seed(0)
        transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    return path


def batch(vocab, G, prompt, response, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.randint(0, vocab, (1, prompt), generator=g).expand(G, prompt)
    c = torch.randint(0, vocab, (G, response), generator=g)
    cmask = torch.ones(G, response, dtype=torch.int64)
    for i in range(G):  # responses of different lengths
        cmask[i, response - (i * response) // (2 * G):] = 0
    adv = torch.randn(G, generator=g)
    return {k: v.to(device) for k, v in dict(prompt_ids=p.contiguous(), prompt_mask=torch.ones_like(p),
                                             completion_ids=c, completion_mask=cmask,
                                             advantages=adv).items()}


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def peak_reset(device):
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak(device):
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


class Phases:
    """The peak of each phase of a step (GiB allocated, since the previous phase ended): which
    pass holds a step's peak. Each end restarts the device's peak count, so the step's peak is
    `top`, the largest since clear(). On CUDA each end also records an event, so that the
    phases' device times (ms, from the previous end or the step's start) can be read once the
    step has synchronized, nothing waiting in between; and the host's time to the same point, so
    that a phase whose host time reaches its device time shows as bound by the host (its kernels
    queued no faster than they run). On the CPU nothing is recorded."""

    def __init__(self, device):
        self.device, self.peaks, self.top, self.events, self.host = device, {}, 0.0, [], []

    def clear(self):
        self.peaks, self.top, self.events, self.host = {}, 0.0, [], []

    def start(self):
        if self.device == "cuda":
            self.events = [("start", torch.cuda.Event(enable_timing=True))]
            self.events[0][1].record()
            self.host = [time.perf_counter()]

    def end(self, name):
        if self.device == "cuda":
            gib = torch.cuda.max_memory_allocated() / 2**30
            self.peaks[name] = round(gib, 3)
            self.top = max(self.top, gib)
            torch.cuda.reset_peak_memory_stats()
            if self.events:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                self.events.append((name, e))
                self.host.append(time.perf_counter())

    def times_ms(self):
        """The last step's phases, in device time (after a synchronize)."""
        return {b[0]: round(a[1].elapsed_time(b[1]), 3) for a, b in zip(self.events, self.events[1:])}

    def host_ms(self):
        """The last step's phases, in the host's time from the previous end to this one's."""
        return {e[0]: round((b - a) * 1e3, 3) for e, a, b in zip(self.events[1:], self.host, self.host[1:])}


def update(loss, opt, phases):
    """A step's end after its loss, the same for every trainer: backward and the optimizer step,
    timed as the phases "backward" and "optimizer". Returns the loss, detached."""
    loss.backward()
    phases.end("backward")
    opt.step()
    opt.zero_grad(set_to_none=True)
    phases.end("optimizer")
    return loss.detach()


class _NoReward:
    __name__ = "none"

    def __call__(self, completions, **kw):
        return [0.0] * len(completions)


def trl_step(variant, path, b, device, checkpointing):
    """A GRPOTrainer on the model; returns a function running one step."""
    import datasets
    from trl import GRPOConfig, GRPOTrainer
    from trl.models.utils import disable_gradient_checkpointing
    handle = None
    if variant.startswith("trl+rlk"):
        from rlk.integrations import trl as rtrl
        handle = rtrl.patch(prefix=variant.endswith("+prefix"))
    G, R = b["completion_ids"].shape
    # trl-mbK: TRL as shipped with the group in micro-batches of K responses (per-device batch K,
    # G / K accumulation steps, what fits a long prompt's group on one GPU): every pass runs K
    # rows at a time, the gradients accumulate, one optimizer step
    mb = int(variant.split("-mb")[1]) if "-mb" in variant else G
    if G % mb:
        raise ValueError("%s: the group (%d) is not a multiple of the micro-batch" % (variant, G))
    accum = G // mb
    args = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=mb,
                      gradient_accumulation_steps=accum, steps_per_generation=accum,
                      num_generations=G, max_completion_length=R, beta=BETA, bf16=True,
                      use_cpu=device == "cpu", report_to="none", gradient_checkpointing=checkpointing,
                      learning_rate=1e-6, logging_steps=1, save_strategy="no")
    trainer = GRPOTrainer(model=path, reward_funcs=_NoReward(), args=args,
                          train_dataset=datasets.Dataset.from_dict({"prompt": ["x"] * G}))
    model = trainer.model
    trainer.current_gradient_accumulation_steps = accum  # what its training loop sets
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1)
    am = torch.cat([b["prompt_mask"], b["completion_mask"]], 1)
    phases = Phases(device)

    def step():
        phases.start()
        inputs = dict(b)
        # the old policy's and the reference's passes at TRL's own batch size (its per-device one),
        # with gradient checkpointing off as TRL's _generate_and_score_completions turns it off
        bs = None if mb == G else mb
        with torch.no_grad(), disable_gradient_checkpointing(model, args.gradient_checkpointing_kwargs):
            inputs["old_per_token_logps"], _, _ = trainer._get_per_token_logps_and_entropies(
                model, ids, am, R, batch_size=bs)
            phases.end("old")
            inputs["ref_per_token_logps"], _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.ref_model, ids, am, R, batch_size=bs)
            phases.end("ref")
        inputs["num_items_in_batch"] = b["completion_mask"].sum()  # the whole group's, as TRL's
        model.train()
        done = 0.0
        # every micro-batch but the last: forward and backward (so with micro-batches the phase
        # "loss" holds their backward too, "backward" the last one's)
        for i in range(0, G - mb, mb):
            part = {k: v[i:i + mb] if v.dim() else v for k, v in inputs.items()}
            loss = trainer.compute_loss(model, part)
            loss.backward()
            done = done + loss.detach()
        part = {k: v[G - mb:] if v.dim() else v for k, v in inputs.items()}
        loss = trainer.compute_loss(model, part)
        phases.end("loss")
        return done + update(loss, opt, phases)
    step.phases = phases
    return step, handle


def ray_or_standin():
    """"ray", or "stand-in" where ray cannot be imported and standin/ray takes its place (verl
    imports ray when it loads; the step timed here never calls it: standin/README.md)."""
    import importlib.util
    if importlib.util.find_spec("ray") is None:
        sys.path.append(os.path.join(HERE, "standin"))
    import ray
    return "stand-in" if os.path.dirname(ray.__file__).startswith(os.path.join(HERE, "standin")) else "ray"


def verl_step(variant, path, b, device, checkpointing):
    """verl's fused forward (FusedLinearForPPO of the variant's backend) and its vanilla loss."""
    import transformers
    verl_step.ray = ray_or_standin()
    import verl.utils.experimental.torch_functional as xf
    from omegaconf import OmegaConf
    from verl.models.transformers.dense_common import forward_with_torch_backend
    from verl.trainer.ppo import core_algos as ca
    handle = None
    if variant == "verl-liger":
        if xf._LIGER_FUSED_LINEAR_SCALED_CROSS_ENTROPY is None:
            raise RuntimeError("liger_kernel is not installed")
        backend = "liger"
    elif variant.startswith("verl-rlk"):
        from rlk.integrations import verl as rv
        handle = rv.patch(prefix=variant.endswith("+prefix"))
        backend = "rlk"
    else:
        backend = "torch"
    load = dict(dtype=torch.bfloat16)
    policy = transformers.AutoModelForCausalLM.from_pretrained(path, **load).to(device)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, **load).to(device)
    for m in (policy, ref):
        m._verl_fused_kernels_backend = "torch" if backend == "rlk" else backend
    if checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    G, R = b["completion_ids"].shape
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1)
    am = torch.cat([b["prompt_mask"], b["completion_mask"]], 1)
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    cfg = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                            "clip_ratio_c": 3.0, "global_batch_info": {}})
    loss_fn = ca.get_policy_loss_fn("vanilla")
    rmask = b["completion_mask"].float()
    adv = b["advantages"][:, None].expand(G, R)

    rmpad = "rmpad" in variant
    if rmpad:  # verl's remove-padding row: the kept tokens back to back, positions from 0 each
        keep = am.bool()
        flat_ids, flat_pos = ids[keep][None], pos[keep][None]
        # the row position that scores response token j of sequence i (its previous token)
        at = torch.zeros_like(am).masked_scatter(keep, torch.arange(int(keep.sum()), device=device))
        resp_rows = at[:, -R - 1:-1]

    def logps(model):
        if rmpad:
            out = forward_with_torch_backend(model, input_ids=flat_ids, position_ids=flat_pos,
                                             return_dict=True, temperature=1.0, use_cache=False)
            return out.log_probs[0][resp_rows], out.entropy[0][resp_rows]
        out = forward_with_torch_backend(model, input_ids=ids, attention_mask=am, position_ids=pos,
                                         return_dict=True, temperature=1.0, use_cache=False)
        return out.log_probs[:, -R - 1:-1], out.entropy[:, -R - 1:-1]

    phases = Phases(device)

    def step():
        phases.start()
        with torch.no_grad():
            old, _ = logps(policy)
            phases.end("old")
            ref_lp, _ = logps(ref)
            phases.end("ref")
        policy.train()  # from here, what verl's update_policy runs
        lp, ent = logps(policy)
        pg, _ = loss_fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=rmask,
                        loss_agg_mode="token-mean", config=cfg)
        kl = ca.kl_penalty(lp, ref_lp, "low_var_kl")
        loss = pg + BETA * ca.agg_loss(kl, rmask, "token-mean")
        phases.end("loss")
        return update(loss, opt, phases)
    step.phases = phases
    return step, handle


def held(device):
    """GiB the process holds on the device after a collection: what a variant finds when it starts
    (an earlier variant's trainer, models and optimizer state live on until their cycles are
    collected)."""
    gc.collect()
    if device != "cuda":
        return None
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated() / 2**30


def profiled(step, device, path):
    """One more step under torch's profiler: the table of its operators and kernels by their own
    device time (host time on the CPU), then by the host's own time, to `path`, and its timeline
    (chrome trace) beside it; returns the top 15 as (name, ms, calls)."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        step()
        sync(device)
    prof.export_chrome_trace(os.path.splitext(path)[0] + ".trace.json")  # the timeline: gaps, overlaps
    events = prof.key_averages()
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    if device == "cuda" and not hasattr(events[0], key):  # torch before the device_* names
        key = "self_cuda_time_total"
    with open(path, "w") as f:
        f.write(events.table(sort_by=key, row_limit=60, max_name_column_width=120))
        # the host's side of the same step: where it waits (synchronizes, copies to the host) and
        # what it spends queuing
        f.write("\n\nby the host's own time\n")
        f.write(events.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=120))
    top = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:15]
    return [(e.key[:160], round(getattr(e, key) / 1e3, 3), e.count) for e in top]


def measure(variant, arch, G, prompt, response, device, reps, work, checkpointing, profile=None):
    before = held(device)
    path = model_dir(arch, work)
    b = batch(ARCHS[arch]["vocab_size"], G, prompt, response, device)
    build = trl_step if variant.startswith("trl") else verl_step
    step, handle = build(variant, path, b, device, checkpointing)
    calls = None
    if variant.endswith("+prefix"):  # the passes that ran packed, and those that fell back (why)
        from rlk.integrations import trl as rtrl, verl as rv
        calls = rtrl.prefix_calls if variant.startswith("trl") else rv.prefix_calls
        calls_before = calls.copy()
    try:
        step()  # warm-up (rlk's kernels compile or load)
        sync(device)
        peak_reset(device)
        phases = getattr(step, "phases", None)
        if phases is not None:
            phases.clear()
        times, phase_times, host_times = [], [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            loss = step()
            sync(device)
            times.append(time.perf_counter() - t0)
            if phases is not None and phases.events:
                phase_times.append(phases.times_ms())
                host_times.append(phases.host_ms())
        row = {"step_s": sorted(times)[len(times) // 2], "min_s": min(times),
               "peak_gib": peak(device), "loss": float(loss)}
        if phases is not None and phases.peaks:
            row["peak_gib"] = max(phases.top, row["peak_gib"] or 0.0)
            row["phase_peaks_gib"] = dict(phases.peaks)  # the last step's, by phase
            # each phase's median over the timed steps (old and ref: forward only; loss: the
            # training forward)
            row["phase_ms"] = {k: sorted(t[k] for t in phase_times)[len(phase_times) // 2]
                               for k in phase_times[-1]} if phase_times else {}
            # the host's time to queue each phase: near its device time, the phase is host-bound
            row["phase_host_ms"] = {k: sorted(t[k] for t in host_times)[len(host_times) // 2]
                                    for k in host_times[-1]} if host_times else {}
        if before is not None:
            row["held_before_gib"] = round(before, 3)  # in peak_gib, not the variant's own
        if calls is not None:
            row["prefix_calls"] = dict(calls - calls_before)
        if build is verl_step:
            row["ray"] = verl_step.ray
        if profile:
            row["profile_top"] = profiled(step, device, profile)
        return row
    finally:
        if handle is not None:
            handle.undo()


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing: no plot")
        return
    ok = [r for r in rows if "step_s" in r]
    if not ok:
        return
    shapes = sorted({(r["arch"], r["G"], r["prompt"], r["response"]) for r in ok})
    present = [v for v in VARIANTS if any(r["variant"] == v for r in ok)]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.9 * len(shapes) * 2), 8))
    width = 0.8 / len(present)
    for k, v in enumerate(present):
        xs, t, m = [], [], []
        for i, s in enumerate(shapes):
            r = [r for r in ok if r["variant"] == v and (r["arch"], r["G"], r["prompt"], r["response"]) == s]
            if r:
                xs.append(i + k * width)
                t.append(r[0]["step_s"])
                m.append(r[0]["peak_gib"] or 0.0)
        color = "C%d" % VARIANTS.index(v)  # a variant's colour is the same in every chart
        axes[0].bar(xs, t, width, label=v, color=color)
        axes[1].bar(xs, m, width, label=v, color=color)
    labels = ["%s\nG%d p%d r%d" % s for s in shapes]
    for ax, name in zip(axes, ("step time (s)", "peak memory (GiB)")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))])
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel(name)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="the tiny architecture at tiny sizes")
    ap.add_argument("--archs", default="qwen2.5-0.5b,qwen2.5-1.5b")
    ap.add_argument("--groups", default="8,16")
    ap.add_argument("--prompts", default="512,2048,4096")
    ap.add_argument("--responses", default="512,1024")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-checkpointing", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="after the timed steps, one more under torch's profiler: its table by each "
                         "operator's and kernel's own device time to profile-<variant>-<shape>.txt "
                         "(then by host time; its timeline beside it, .trace.json), the top 15 "
                         "in the row")
    ap.add_argument("--out-dir", default=os.environ.get("OUT") or os.path.join(HERE, "..", "..", "build", "trainer-step"))
    ap.add_argument("--replot", nargs="+", metavar="FILE",
                    help="no run: one chart (--out-dir/trainer_step.png) of the rows in these files "
                         "(this script's JSON, or its output's JSON lines)")
    a = ap.parse_args()
    if a.replot:
        rows = []
        for path in a.replot:
            with open(path) as f:
                text = f.read()
            if path.endswith(".json"):
                rows += json.loads(text)["rows"]
            else:
                rows += [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        os.makedirs(a.out_dir, exist_ok=True)
        plot(rows, os.path.join(a.out_dir, "trainer_step.png"))
        return
    if a.tiny:
        a.archs, a.groups, a.prompts, a.responses, a.reps = "tiny", "4", "16", "8", 1
    os.makedirs(a.out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="rlk-trainer-step-")
    rows = []
    for arch in a.archs.split(","):
        for G in map(int, a.groups.split(",")):
            for p in map(int, a.prompts.split(",")):
                for r in map(int, a.responses.split(",")):
                    for v in a.variants.split(","):
                        row = dict(arch=arch, G=G, prompt=p, response=r, variant=v)
                        try:
                            prof = os.path.join(a.out_dir, "profile-%s-%s-g%d-p%d-r%d.txt" % (
                                v, arch, G, p, r)) if a.profile else None
                            row.update(measure(v, arch, G, p, r, a.device, a.reps, work,
                                               not a.no_checkpointing, prof))
                        except Exception as e:  # noqa: BLE001 (recorded, the sweep goes on)
                            row["error"] = "%s: %s" % (type(e).__name__, e)
                        if a.device == "cuda":
                            torch.cuda.empty_cache()
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    meta = {"device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
            "torch": torch.__version__, "checkpointing": not a.no_checkpointing, "reps": a.reps}
    for pkg in ("trl", "verl", "transformers"):
        try:
            meta[pkg] = __import__(pkg).__version__
        except Exception:
            meta[pkg] = None
    with open(os.path.join(a.out_dir, "trainer_step.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    plot(rows, os.path.join(a.out_dir, "trainer_step.png"))
    print("wrote", a.out_dir)


if __name__ == "__main__":
    main()
