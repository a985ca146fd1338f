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
"""
__all__ = ["verl", "trl", "openrlhf", "transformers"]
