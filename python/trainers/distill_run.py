"""One DistillationTrainer run (on-policy distillation) of the tiny student from a wider tiny
teacher (tiny.py), trained under bf16 autocast (TRL projects f32 heads in f32 off autocast,
which rlk leaves to TRL), on the CPU: TRL as installed, or with rlk.integrations.trl_distill.patch().
Writes what the tests compare to OUT (a .pt file): the logged loss and grad norm of each step,
the sampled completions, the updated weights, per-tensor sums of gradient norms and, when
patched, the patch's report and divergence_calls. Run as `python distill_run.py OUT [--rlk]
[--beta B]`."""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # python/: the rlk package of this tree

import torch  # noqa: E402

import tiny  # noqa: E402
from grpo_run import GradientSum  # noqa: E402

# Fixed by the tests' derivations (test_trl_distill.py): SGD, so a weight moves by lr times its
# gradient.
LR = 0.05
STEPS = 4
TEMPERATURE = 0.9
TEACHER_HIDDEN = 96


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rlk", action="store_true", help="rlk.integrations.trl_distill.patch()")
    ap.add_argument("--beta", type=float, default=0.5, help="DistillationConfig.beta")
    a = ap.parse_args()
    from trl import DistillationConfig, DistillationTrainer
    handle = None
    if a.rlk:
        from rlk.integrations import trl_distill
        handle = trl_distill.patch()
    work = tempfile.mkdtemp(prefix="rlk-distill-")
    student = tiny.saved(os.path.join(work, "student"))
    teacher = tiny.saved(os.path.join(work, "teacher"), seed=99, hidden=TEACHER_HIDDEN)
    args = DistillationConfig(
        output_dir=os.path.join(work, "out"), per_device_train_batch_size=8,
        max_completion_length=8, max_steps=STEPS, learning_rate=LR, optim="sgd",
        lr_scheduler_type="constant", max_grad_norm=1e6, beta=a.beta, temperature=TEMPERATURE,
        logging_steps=1, report_to="none", use_cpu=True, bf16=True, seed=3, save_strategy="no",
        disable_tqdm=True)
    completions = []

    trainer = DistillationTrainer(model=student, teacher_model=teacher, args=args,
                                  train_dataset=tiny.prompts(64), processing_class=tiny.tokenizer())
    own = trainer._generate_and_score_completions

    def recorded(inputs):
        out = own(inputs)
        completions.extend(tuple(r) for r in out["completion_ids"].tolist())
        return out
    trainer._generate_and_score_completions = recorded
    trainer.add_callback(GradientSum(trainer))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trainer.train()
    model = trainer.accelerator.unwrap_model(trainer.model)
    weights = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    logs = [(h["loss"], h["grad_norm"]) for h in trainer.state.log_history
            if "loss" in h and "grad_norm" in h]
    sums = [c for c in trainer.callback_handler.callbacks if hasattr(c, "sums")][0].sums
    out = {"logs": logs, "completions": completions, "weights": weights, "grad_norm_sum": sums,
           "trainable": [n for n, p in model.named_parameters() if p.requires_grad]}
    if handle is not None:
        from rlk.integrations import trl_distill
        out["report"] = handle.report
        out["calls"] = dict(trl_distill.divergence_calls)
    torch.save(out, a.out)


if __name__ == "__main__":
    main()
