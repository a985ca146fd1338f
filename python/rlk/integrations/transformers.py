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
no dropout, no sliding window, no attention mask (the layout is the mask; register() makes
transformers build none), q/k/v in bf16 or f16 (or any dtype under autocast, which rounds them
to its 16-bit dtype as it does for SDPA) with a head dim of 64 or 128, and the layout passed as
the forward's `rlk_layout` keyword (transformers hands unknown keywords down to the attention
function).

A trainer's model also generates and runs unpacked batches: share(model) gives it the attention
"rlk_prefix_or_<impl>" (<impl> its own, e.g. sdpa), which is "rlk_prefix" in a forward that
carries `rlk_layout` (and packed_mask() as its attention_mask) and the model's own attention and
masks in every other. The choice is made
per call from the call's own keywords, so a gradient-checkpointed layer recomputed in the
backward takes the same path as in its forward.
"""
import sys

import torch

from .. import autograd as _ag
from ..ops import prefix_attention as _pa

__all__ = ["NAME", "register", "share", "shared_name", "packed_mask", "packed_inputs", "response_logprobs",
           "token_logprobs"]

NAME = "rlk_prefix"


def _no_mask(*args, **kwargs):
    """The attention mask of "rlk_prefix": none (the packed layout is the mask)."""
    return None


def packed_mask(device=None):
    """The attention_mask a packed forward of a shared model passes: a 4-D mask of no elements,
    which transformers' mask builders hand on as they get it, for every model (the layout is the
    mask, and the "rlk_prefix" attention reads none): no [T, T] mask is built for the packed row."""
    return torch.zeros((1, 1, 0, 0), dtype=torch.bool, device=device)


# Configuration keys of token mixers other than attention (state-space, convolution and linear
# attention layers), which would run across the packed row's responses: share() refuses them.
_OTHER_MIXERS = ("mamba", "ssm_", "conv_", "linear_num", "linear_key", "linear_conv", "block_types",
                 "layers_block_type", "attn_layer_period", "hybrid_")


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
    if kwargs.get("sliding_window") is not None:
        raise ValueError("attention %r: no sliding window (got %r)" % (NAME, kwargs["sliding_window"]))
    # what a model's own attention would apply and the kernels have not: refused, never dropped
    if kwargs.get("softcap"):
        raise ValueError("attention %r: no logit softcapping (got %r)" % (NAME, kwargs["softcap"]))
    if kwargs.get("s_aux") is not None:
        raise ValueError("attention %r: no attention sinks (s_aux)" % NAME)
    dt = _operand_dtype(query, key, value)
    q = query[0].transpose(0, 1).to(dt).contiguous()
    k = key[0].transpose(0, 1).to(dt).contiguous()
    v = value[0].transpose(0, 1).to(dt).contiguous()
    if torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value)):
        out = _ag.prefix_attention(q, k, v, layout, scale=scaling)
    else:
        out = _pa.prefix_attention(q, k, v, layout, scale=scaling, lse=False).out
    return out.unsqueeze(0), None


def _operand_dtype(query, key, value):
    """The 16-bit dtype the kernels read q, k and v in: theirs when they share one; under
    autocast its dtype (autocast rounds SDPA's operands so: q and k leave the rotary embedding
    in f32 when its cos/sin are f32)."""
    low = (torch.bfloat16, torch.float16)
    if query.dtype in low and key.dtype is query.dtype and value.dtype is query.dtype:
        return query.dtype
    kind = query.device.type
    if torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) in low:
        return torch.get_autocast_dtype(kind)
    raise ValueError("attention %r: q, k, v in %s, %s, %s without autocast; the kernels read "
                     "bf16 or f16" % (NAME, query.dtype, key.dtype, value.dtype))


def shared_name(impl):
    """The attention name share() gives a model whose own attention is `impl`."""
    return "%s_or_%s" % (NAME, impl)


def _own_attention(impl, module):
    """The attention function `impl` names for this attention module (eager: its model file's
    own eager_attention_forward, as the module's lookup falls back to)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    if impl in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[impl]
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if impl == "eager" and eager is not None:
        return eager
    raise ValueError("attention %r: %r is not a registered attention" % (shared_name(impl), impl))


def _register_shared(impl):
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    def attention(module, query, key, value, attention_mask, **kwargs):
        if kwargs.get("rlk_layout") is not None:
            return prefix_attention_forward(module, query, key, value, None, **kwargs)
        return _own_attention(impl, module)(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(shared_name(impl), attention)
    AttentionMaskInterface.register(shared_name(impl), ALL_MASK_ATTENTION_FUNCTIONS[impl])


def share(model):
    """Gives the transformers model inside `model` (a DDP or PEFT wrapper, or the model) the
    attention shared_name(its own): "rlk_prefix" where a forward passes rlk_layout, its own
    elsewhere. Idempotent. Returns None, or why the model cannot take it (then nothing is
    changed)."""
    from transformers import PreTrainedModel
    top = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)
    if top is None:
        return "not a transformers model"
    impl = top.config._attn_implementation
    if impl.startswith(NAME):
        return None
    if not top._can_set_attn_implementation():
        return "%s does not take a registered attention" % type(top).__name__
    text = top.config.get_text_config()
    kinds = set(getattr(text, "layer_types", None) or ())
    window = getattr(text, "sliding_window", None)
    if "sliding_attention" in kinds or (not kinds and window and getattr(text, "use_sliding_window", True)):
        return "sliding-window attention layers"
    if kinds - {"full_attention"}:
        return "layers other than attention (%s): they would mix the packed responses" % ", ".join(
            sorted(kinds - {"full_attention"}))
    other = sorted(k for k in text.to_dict() if k.startswith(_OTHER_MIXERS))
    if other:
        return "token mixers other than attention (%s): they would mix the packed responses" % other[0]
    if getattr(text, "attn_logit_softcapping", None):
        return "attention logit softcapping %g (the prefix attention has none)" % text.attn_logit_softcapping
    if getattr(text, "attention_dropout", 0.0):
        return "attention dropout %g (the prefix attention has none)" % text.attention_dropout
    D = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if D not in (64, 128):
        return "head dim %d (the kernels take 64 or 128)" % D
    _register_shared(impl)
    top.set_attn_implementation(shared_name(impl))
    return None


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
    model.set_attn_implementation("rlk_prefix")). Every prompt has at least one token (the
    position its responses' first tokens are scored from)."""
    prompts, responses = list(prompts), [list(r) for r in responses]
    for p, prompt in enumerate(prompts):
        if len(prompt) == 0 and p < len(responses) and responses[p]:
            raise ValueError("response_logprobs: prompt %d is empty: its responses' first tokens have no "
                             "position to be scored from" % p)
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
    (its log-prob and entropy 0, no gradient), e.g. the prompt. Returns logp [B, T - 1] f32 (and the entropy
    with entropy=True), differentiable in the model's parameters."""
    from ._head import unfused_head
    why = unfused_head(model)
    if why is not None:
        raise ValueError("token_logprobs: %s is not fused" % why)
    head = model.get_output_embeddings()
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    hidden = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                  **model_kwargs).last_hidden_state
    labels = input_ids[:, 1:]
    if labels_mask is not None:
        labels = labels.masked_fill(labels_mask == 0, -100)
    out = _ag.linear_token_logprob(hidden[:, :-1], head.weight, labels,
                                   temperature=float(temperature), ignore_index=-100,
                                   entropy=entropy)
    if not entropy or labels_mask is None:
        return out
    # the op's entropy of an ignored row has no gradient: 0 there, as its log-prob
    logp, ent = out
    return logp, ent.masked_fill(labels == -100, 0.0)
