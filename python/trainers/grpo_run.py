"""One GRPOTrainer run on the tiny model (tiny.py), on the CPU: TRL as installed, or with rlk's
patch(). Writes what the tests compare to OUT (a .pt file): the logged loss and grad norm of
each step, the sampled completions, the updated weights and, when patched, the patch's report,
head_calls and prefix_calls; rank r > 0 of a DDP run writes its weights to OUT.rank<r>. Run as
`python grpo_run.py OUT [--rlk] [--prefix] [--accum N] ...`, or under torchrun (gloo) for DDP."""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # python/: the rlk package of this tree

import torch  # noqa: E402

import tiny  # noqa: E402

# Fixed by the tests' derivations (test_trl.py): SGD, so a weight moves by lr times its gradient.
LR = 0.05
BETA = 0.04
STEPS = 5
TEMPERATURE = 0.9


def reward(completions, completion_ids, **kwargs):
    """A reward that spreads the group's advantages: the completion's length mod 3 and its first
    token. Records the completions (the tests check both runs sampled the same)."""
    reward.seen.extend(tuple(c) for c in completion_ids)
    return [float(len(c) % 3) - 1.0 + 0.1 * (c[0] % 5 if c else 0) for c in completion_ids]


reward.seen = []


class GradientSum:
    """Sums the gradient's 2-norm of every trainable tensor over the optimizer steps (before
    each step): what bounds how far apart two runs' weights may drift (test_trl.py)."""

    def __new__(cls, trainer):
        from transformers import TrainerCallback

        class Callback(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                for n, p in trainer.accelerator.unwrap_model(trainer.model).named_parameters():
                    if p.grad is not None:
                        g = p.grad.detach().float().norm().item()
                        Callback.sums[n] = Callback.sums.get(n, 0.0) + g
        Callback.sums = {}
        return Callback()


def options(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rlk", action="store_true", help="rlk.integrations.trl.patch()")
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8, help="per-process batch (completions)")
    ap.add_argument("--cast-head", action="store_true", help="cast_lm_head_to_fp32")
    ap.add_argument("--peft", action="store_true", help="a LoRA adapter (peft) on the policy")
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    ap.add_argument("--prefix", action="store_true",
                    help="patch(prefix=True): each prompt group packed, prefix-shared attention")
    ap.add_argument("--prefix-model", action="store_true", help="tiny.PREFIX_MODEL")
    ap.add_argument("--sensitive", action="store_true", help="tiny.SENSITIVE")
    ap.add_argument("--steps-per-generation", type=int, default=None,
                    help="GRPOConfig's (above the accumulation steps: an old-policy pass)")
    ap.add_argument("--record", action="store_true",
                    help="keep each step's inputs and the weights it started from, and what "
                         "generation returned")
    ap.add_argument("--replay", default=None,
                    help="a recorded run's OUT: generation returns what it returned there")
    return ap.parse_args(argv)


def trainer(a, work):
    """The GRPOTrainer of options `a` on the tiny model saved under `work`."""
    from trl import GRPOConfig, GRPOTrainer
    kw = dict(tiny.PREFIX_MODEL if a.prefix_model else {}, **(tiny.SENSITIVE if a.sensitive else {}))
    path = tiny.saved(os.path.join(work, "model"), **kw)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = GRPOConfig(
        output_dir=os.path.join(work, "out"), per_device_train_batch_size=a.batch,
        num_generations=4, gradient_accumulation_steps=a.accum, max_completion_length=8,
        max_steps=STEPS, learning_rate=LR, optim="sgd", lr_scheduler_type="constant",
        max_grad_norm=1e6, beta=BETA, temperature=TEMPERATURE, logging_steps=1, report_to="none",
        use_cpu=True, bf16=True, seed=3, save_strategy="no", disable_tqdm=True,
        cast_lm_head_to_fp32=a.cast_head, gradient_checkpointing=a.checkpointing,
        ddp_backend="gloo" if world > 1 else None, steps_per_generation=a.steps_per_generation)
    peft_config = None
    if a.peft:
        from peft import LoraConfig
        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                 task_type="CAUSAL_LM")
    return GRPOTrainer(model=path, reward_funcs=reward, args=args,
                       train_dataset=tiny.prompts(64), processing_class=tiny.tokenizer(),
                       peft_config=peft_config)


def record(t):
    """Keeps, per micro-step, the inputs GRPOTrainer trains on (host copies) and the weights the
    step starts from (those of its policy pass, and of the old-policy pass when it generates)."""
    own = t._prepare_inputs
    t.recorded = []

    def prepare(generation_batch):
        model = t.accelerator.unwrap_model(t.model)
        weights = {n: p.detach().float().clone() for n, p in model.named_parameters()}
        inputs = own(generation_batch)
        t.recorded.append({"weights": weights, "inputs": {
            k: v.detach().cpu() for k, v in inputs.items() if torch.is_tensor(v)}})
        return inputs
    t._prepare_inputs = prepare


def replay(t, recorded):
    """Generation returns, call by call, what a recorded run's generation returned (checking it
    was asked the same prompts), and leaves torch's generator where that run's left it: the
    sampled completions (whose tokens a tiny difference in the weights can flip) are the same
    in both runs, and so is everything drawn after them (TRL's shuffle)."""
    model = t.accelerator.unwrap_model(t.model)
    calls = iter(recorded)

    def generate(input_ids=None, **kwargs):
        call = next(calls)
        assert torch.equal(input_ids.cpu(), call["input_ids"]), "replay: other prompts"
        torch.set_rng_state(call["rng"])
        return call["output"].to(input_ids.device)
    model.generate = generate


def record_generation(t):
    model = t.accelerator.unwrap_model(t.model)
    own = model.generate
    t.generated = []

    def generate(input_ids=None, **kwargs):
        out = own(input_ids=input_ids, **kwargs)
        t.generated.append({"input_ids": input_ids.cpu(), "output": out.cpu(),
                            "rng": torch.get_rng_state()})
        return out
    model.generate = generate


def _leave_process_group():
    """Both DDP ranks meet, then close the process group: a rank that exits with gloo's threads
    still up can abort at exit ("terminate called without an active exception")."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def main():
    a = options()
    handle = None
    if a.rlk or a.prefix:
        from rlk.integrations import trl as rtrl
        handle = rtrl.patch(prefix=a.prefix)
    t = trainer(a, tempfile.mkdtemp(prefix="rlk-grpo-"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    t.add_callback(GradientSum(t))
    if a.record:
        record(t)
        record_generation(t)
    if a.replay:
        replay(t, torch.load(a.replay)["generated"])
    t.train()
    rank = t.accelerator.process_index
    model = t.accelerator.unwrap_model(t.model)
    weights = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    if rank != 0:  # each rank's weights: DDP all-reduces the gradients, so they agree
        torch.save({"weights": weights}, "%s.rank%d" % (a.out, rank))
        _leave_process_group()
        return
    logs = [(h["loss"], h["grad_norm"], h.get("kl")) for h in t.state.log_history
            if "loss" in h and "grad_norm" in h]
    sums = [c for c in t.callback_handler.callbacks if hasattr(c, "sums")][0].sums
    out = {"logs": logs, "completions": reward.seen, "weights": weights, "grad_norm_sum": sums,
           "trainable": [n for n, p in model.named_parameters() if p.requires_grad],
           "wrapped": type(t.model_wrapped).__name__, "world": world,
           "recorded": getattr(t, "recorded", None), "generated": getattr(t, "generated", None)}
    if handle is not None:
        from rlk.integrations import trl as rtrl
        out["report"] = handle.report
        out["head_calls"] = dict(rtrl.head_calls)
        out["prefix_calls"] = dict(rtrl.prefix_calls)
    torch.save(out, a.out)
    _leave_process_group()


if __name__ == "__main__":
    main()
