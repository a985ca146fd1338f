"""Drop-in replacements for the loss functions of verl, TRL and OpenRLHF (imports torch), and
prefix-shared attention for transformers models (`transformers`: a GRPO group's prompt processed
once).

Each submodule offers functions with its trainer's own signature and semantics, computed by
rlk's fused kernels, and a patch() that swaps them into the installed trainer (undone by the
returned handle's undo(), or use it as a context manager):

    from rlk.integrations import verl as rlk_verl
    with rlk_verl.patch():          # verl's compute_policy_loss_* now run on rlk
        trainer.fit()

The settings each trainer exposes map to rlk arguments as the README's table shows; where a
trainer's convention differs from rlk's default (clamp gradients on a bound, sequence-ratio
gradients, normalizers) the adapter passes the trainer's.

patch() checks the trainer's version (UntestedVersion unless force=True) and its handle's
report says what it swapped and what it left. TRL's, verl's and OpenRLHF's also route the
trainer's log-probs and entropy from hidden states through rlk's fused LM head (_head); TRL's
and verl's patch(prefix=True) run each GRPO group's shared prompt once with the prefix-shared
attention (_prefix, transformers.share). `workers` patches every process of a Ray-based trainer
(runtime_env's worker_process_setup_hook).

On the rollout side, `rollout` decodes a transformers model with rlk.linear_sample and `vllm`
routes vLLM's sample step through it (patch(runner), or vLLM's general plugin entry point), so
that the rollout's log-probs are the trainer's rlk.linear_logprob bits.
"""
__all__ = ["verl", "trl", "openrlhf", "transformers", "workers", "rollout", "vllm"]
