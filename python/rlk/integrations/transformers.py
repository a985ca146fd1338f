"""transformers on rlk: a causal LM runs a GRPO group with its prompt processed once, and its LM
head fused with the log-softmax (the logits never stored).

    from rlk.integrations import transformers as rlk_tf
    logp = rlk_tf.token_logprobs(model, input_ids)   # lm_head + log-softmax fused, differentiable

    rlk_tf.register()                          # attention "rlk_prefix" in transformers' registry
    model.set_attn_implementation("rlk_prefix")
    logps = rlk_tf.response_logprobs(model, prompts, responses)

A batch of prompts, each with its group of responses, is packed into one token stream
[prefix | r_1 | ... | r_G] per prompt (rlk.pack_grpo's layout). Every response's positions
continue from its prompt's length, so rotary embeddings see what the replicated batch
[prompt; r_i] would show; the attention is rlk.prefix_attention: prefix tokens attend causally
within the prefix, response tokens to the whole prefix and causally within their own response.
The prompt's keys and values are computed once per group instead of G times, and their
gradients are summed over the group by the attention's backward.

What the "rlk_prefix" attention needs from a model: one packed sequence (batch 1), no cache,
no dropout, no attention mask (the layout is the mask; register() makes transformers build
none), q/k/v in bf16 or f16 with a head dim of 64 or 128, and the layout passed as the forward's
`rlk_layout` keyword (transformers hands unknown keywords down to the attention function).
"""
import torch

from .. import autograd as _ag
from ..ops import prefix_attention as _pa

__all__ = ["NAME", "register", "packed_inputs", "response_logprobs", "token_logprobs"]

NAME = "rlk_prefix"


def _no_mask(*args, **kwargs):
    """The attention mask of "rlk_prefix": none (the packed layout is the mask)."""
    return None


def prefix_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             **kwargs):
    """transformers' attention-function signature over rlk.prefix_attention: query [1, Hq, T, D],
    key and value [1, Hkv, T, D] -> ([1, T, Hq, D], None)."""
    layout = kwargs.get("rlk_layout")
    if layout is None:
        raise ValueError("attention %r: pass the packed layout as the model's rlk_layout= keyword"
                         % NAME)
    if query.shape[0] != 1:
        raise ValueError("attention %r: one packed sequence (batch 1), got batch %d"
                         % (NAME, query.shape[0]))
    if dropout:
        raise ValueError("attention %r: no dropout (got %g)" % (NAME, dropout))
    if query.shape[2] != layout.tokens or key.shape[2] != layout.tokens:
        raise ValueError("attention %r: %d query and %d key tokens, the layout has %d (no cache)"
                         % (NAME, query.shape[2], key.shape[2], layout.tokens))
    q = query[0].transpose(0, 1).contiguous()
    k = key[0].transpose(0, 1).contiguous()
    v = value[0].transpose(0, 1).contiguous()
    if torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value)):
        out = _ag.prefix_attention(q, k, v, layout, scale=scaling)
    else:
        out = _pa.prefix_attention(q, k, v, layout, scale=scaling, lse=False).out
    return out.unsqueeze(0), None


def register():
    """Registers "rlk_prefix" with transformers' attention and attention-mask registries (once
    is enough; registering again replaces the same functions)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(NAME, prefix_attention_forward)
    AttentionMaskInterface.register(NAME, _no_mask)


def packed_inputs(prompts, responses, device=None):
    """(input_ids [1, T], position_ids [1, T], layout) of prompts[p] (1-D token tensors) with
    their responses[p] (lists of 1-D token tensors): each response's positions continue from
    its prompt's length."""
    ids, layout = _pa.pack_grpo(list(prompts), [list(r) for r in responses])
    pos = torch.empty(layout.tokens, dtype=torch.int64)
    for p in range(layout.num_prompts):
        a, b = layout.prefix_range(p)
        pos[a:b] = torch.arange(b - a)
        for s, e in layout.response_ranges(p):
            pos[s:e] = torch.arange(b - a, b - a + e - s)
    device = ids.device if device is None else device
    return ids.to(device)[None], pos.to(device)[None], layout


def response_logprobs(model, prompts, responses, **model_kwargs):
    """Per prompt, the list of its responses' token log-probs (f32, one per response token,
    differentiable in the model's parameters), computed with the prompt processed once: the
    first response token is scored from the prompt's last position, shared by the group. The
    model must use the "rlk_prefix" attention (register(), then
    model.set_attn_implementation("rlk_prefix"))."""
    device = next(model.parameters()).device
    ids, pos, layout = packed_inputs(prompts, responses, device)
    logits = model(input_ids=ids, position_ids=pos, rlk_layout=layout, use_cache=False,
                   **model_kwargs).logits[0]
    rows, labels, spans = [], [], []
    n = 0
    for p in range(layout.num_prompts):
        a, b = layout.prefix_range(p)
        for s, e in layout.response_ranges(p):
            # the token at s is predicted from the prompt's last position, s + j from s + j - 1
            rows.append(torch.tensor([b - 1], device=device))
            rows.append(torch.arange(s, e - 1, device=device))
            labels.append(ids[0, s:e])
            spans.append((n, n + e - s))
            n += e - s
    rows = torch.cat(rows)
    logp = _ag.token_logprob(logits.index_select(0, rows), torch.cat(labels))
    out, k = [], 0
    for p in range(layout.num_prompts):
        group = []
        for _ in layout.response_ranges(p):
            s, e = spans[k]
            group.append(logp[s:e])
            k += 1
        out.append(group)
    return out


def token_logprobs(model, input_ids, attention_mask=None, *, labels_mask=None, temperature=1.0,
                   entropy=False, **model_kwargs):
    """The log-probs of input_ids[:, 1:] under a transformers causal LM with its LM head fused
    with the log-softmax (rlk.autograd.linear_token_logprob against model.lm_head.weight): the
    model's body gives the hidden states, and the [B, T - 1, V] logits are never stored, in the
    forward or the backward. labels_mask [B, T - 1] (optional): 0 where a token is not scored
    (its log-prob 0, no gradient), e.g. the prompt. Returns logp [B, T - 1] f32 (and the entropy
    with entropy=True), differentiable in the model's parameters."""
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("token_logprobs: an LM head with a bias is not fused")
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    hidden = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                  **model_kwargs).last_hidden_state
    labels = input_ids[:, 1:]
    if labels_mask is not None:
        labels = labels.masked_fill(labels_mask == 0, -100)
    return _ag.linear_token_logprob(hidden[:, :-1], head.weight, labels,
                                    temperature=float(temperature), ignore_index=-100,
                                    entropy=entropy)
