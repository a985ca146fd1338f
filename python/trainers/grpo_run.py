"""One GRPOTrainer run on the tiny model (tiny.py), on the CPU: TRL as installed, or with rlk's
patch(). Writes what the tests compare to OUT (a .pt file): the logged loss and grad norm of
each step, the sampled completions, the updated weights and, when patched, the patch's report
and head_calls; rank r > 0 of a DDP run writes its weights to OUT.rank<r>. Run as
`python grpo_run.py OUT [--rlk] [--accum N] ...`, or under torchrun (gloo) for DDP."""
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rlk", action="store_true", help="rlk.integrations.trl.patch()")
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8, help="per-process batch (completions)")
    ap.add_argument("--cast-head", action="store_true", help="cast_lm_head_to_fp32")
    ap.add_argument("--peft", action="store_true", help="a LoRA adapter (peft) on the policy")
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    a = ap.parse_args()
    from trl import GRPOConfig, GRPOTrainer
    handle = None
    if a.rlk:
        from rlk.integrations import trl as rtrl
        handle = rtrl.patch()
    work = tempfile.mkdtemp(prefix="rlk-grpo-")
    path = tiny.saved(os.path.join(work, "model"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = GRPOConfig(
        output_dir=os.path.join(work, "out"), per_device_train_batch_size=a.batch,
        num_generations=4, gradient_accumulation_steps=a.accum, max_completion_length=8,
        max_steps=STEPS, learning_rate=LR, optim="sgd", lr_scheduler_type="constant",
        max_grad_norm=1e6, beta=BETA, temperature=TEMPERATURE, logging_steps=1, report_to="none",
        use_cpu=True, bf16=True, seed=3, save_strategy="no", disable_tqdm=True,
        cast_lm_head_to_fp32=a.cast_head, gradient_checkpointing=a.checkpointing,
        ddp_backend="gloo" if world > 1 else None)
    peft_config = None
    if a.peft:
        from peft import LoraConfig
        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                 task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=path, reward_funcs=reward, args=args,
                          train_dataset=tiny.prompts(64), processing_class=tiny.tokenizer(),
                          peft_config=peft_config)
    trainer.add_callback(GradientSum(trainer))
    trainer.train()
    rank = trainer.accelerator.process_index
    model = trainer.accelerator.unwrap_model(trainer.model)
    weights = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    if rank != 0:  # each rank's weights: DDP all-reduces the gradients, so they agree
        torch.save({"weights": weights}, "%s.rank%d" % (a.out, rank))
        return
    logs = [(h["loss"], h["grad_norm"], h.get("kl")) for h in trainer.state.log_history
            if "loss" in h and "grad_norm" in h]
    sums = [c for c in trainer.callback_handler.callbacks if hasattr(c, "sums")][0].sums
    out = {"logs": logs, "completions": reward.seen, "weights": weights, "grad_norm_sum": sums,
           "trainable": [n for n, p in model.named_parameters() if p.requires_grad],
           "wrapped": type(trainer.model_wrapped).__name__, "world": world}
    if handle is not None:
        from rlk.integrations import trl as rtrl
        out["report"] = handle.report
        out["head_calls"] = dict(rtrl.head_calls)
    torch.save(out, a.out)


if __name__ == "__main__":
    main()
