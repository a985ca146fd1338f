"""A rollout whose log-probs the trainer reproduces bit for bit: a decode loop on a transformers
causal LM whose tokens come from rlk.linear_sample (the LM head's GEMM, the draw and the token's
log-prob in one call, the logits never returned), then the trainer's rlk.linear_logprob of those
tokens on the same hidden states gives every token the rollout's log-prob, whatever batch the
trainer scores it in.

    from rlk.integrations import rollout
    out = rollout.decode(model, prompts, 32, temperature=0.8, top_p=0.9, seeds=seeds)
    lp = rlk.linear_logprob(out.hidden.flatten(0, 1), rollout.head_weight(model),
                            out.tokens.flatten(), temperature=0.8)
    assert torch.equal(lp.logp, out.logp.flatten())          # the trainer's bits are the rollout's
    kept = rlk.linear_logprob(..., threshold=out.threshold.flatten())   # over the kept sets

The contract's boundary is the hidden states: equal hidden states, equal bits. A trainer that
recomputes them in one forward over prompt and completion runs the model's own kernels on other
batch shapes (attention over the whole sequence, not a cache), which round otherwise; keep the
rollout's hidden states, or make the model's forward batch invariant as well.
"""
import collections

import torch

from ..ops.linear_sample import linear_sample
from ._head import unfused_head

__all__ = ["Rollout", "decode", "head_weight"]

Rollout = collections.namedtuple("Rollout", "tokens logp threshold hidden")


def head_weight(model):
    """The LM head's weight [V, H] (its output embeddings)."""
    return model.get_output_embeddings().weight


@torch.no_grad()
def decode(model, input_ids, max_new_tokens, *, temperature=1.0, top_k=None, top_p=None, min_p=None,
           seeds=None, offset=0):
    """Decodes max_new_tokens tokens after prompts input_ids [B, P] (of one length: no padding)
    with the model's body and its KV cache, each step's tokens drawn by rlk.linear_sample from
    the last hidden states and the LM head. temperature (one for the call), top_k, top_p, min_p
    and seeds (an int64 [B] per row, so a row's tokens do not depend on the batch) as
    rlk.linear_sample's; step t draws at offset + t. Returns Rollout(tokens [B, T] i64, logp
    [B, T] f32, threshold [B, T] f32, hidden [B, T, H]: the hidden state each token was drawn
    from). A model whose logits are not hidden @ W (a bias, a logit scale or softcap, an adapter
    on the head) is refused (ValueError): linear_sample draws from hidden @ W / temperature."""
    why = unfused_head(model)
    if why is not None:
        raise ValueError("rollout.decode: %s is not fused (linear_sample draws from "
                         "hidden @ W / temperature)" % why)
    body = model.get_decoder()
    weight = head_weight(model)
    ids, past = input_ids, None
    tokens, logp, threshold, hidden = [], [], [], []
    for t in range(max_new_tokens):
        out = body(input_ids=ids, past_key_values=past, use_cache=True)
        past = out.past_key_values
        h = out.last_hidden_state[:, -1].contiguous()
        r = linear_sample(h, weight, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          seed=seeds, offset=offset + t, threshold=True)
        tokens.append(r.tokens)
        logp.append(r.logp)
        threshold.append(r.threshold)
        hidden.append(h)
        ids = r.tokens[:, None]
    return Rollout(torch.stack(tokens, 1), torch.stack(logp, 1), torch.stack(threshold, 1),
                   torch.stack(hidden, 1))
