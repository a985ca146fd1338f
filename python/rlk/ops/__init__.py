"""Op families, one module each: its args struct mirror (registered for the ABI checks), its
rlk.Op, and the functional call. Adding an op family = one module here + its lines below."""
from . import (group_advantage, linear_divergence, linear_logprob, linear_sample, logprob, losses,
               prefix_attention, returns, sample, token_baseline, token_kl, vocab_parallel)

OPS = {
    "group_advantage": group_advantage.OP,
    "policy_loss": losses.POLICY_OP,
    "value_loss": losses.VALUE_OP,
    "gae": returns.GAE_OP,
    "discounted_returns": returns.RETURNS_OP,
    "reverse_cumsum": returns.CUMSUM_OP,
    "masked_whiten": returns.WHITEN_OP,
    "logprob": logprob.FORWARD_OP,
    "logprob_backward": logprob.BACKWARD_OP,
    "logprob_combine": vocab_parallel.COMBINE_OP,
    "sample": sample.OP,
    "linear_logprob": linear_logprob.OP,
    "linear_logprob_backward": linear_logprob.BACKWARD_OP,
    "linear_policy_loss": linear_logprob.POLICY_OP,
    "linear_sample": linear_sample.OP,
    "linear_divergence": linear_divergence.OP,
    "linear_divergence_backward": linear_divergence.BACKWARD_OP,
    "linear_divergence_combine": linear_divergence.COMBINE_OP,
    "prefix_attention": prefix_attention.FORWARD_OP,
    "prefix_attention_backward": prefix_attention.BACKWARD_OP,
    "token_baseline": token_baseline.OP,
    "token_kl": token_kl.OP,
}
