"""flash_attn.bert_padding's padding helpers (flash-attention 2.8's behaviour), in torch."""
import torch
import torch.nn.functional as F
from einops import rearrange

__all__ = ["index_first_axis", "pad_input", "rearrange", "unpad_input"]


def index_first_axis(x, indices):
    """x[indices] along the first axis (differentiable)."""
    return x.index_select(0, indices)


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states [B, S, ...] and attention_mask [B, S] -> (the kept tokens [nnz, ...],
    their flat indices in B * S, cu_seqlens i32 [B + 1], the longest row, each row's count)."""
    used = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = used.sum(-1, dtype=torch.int32)
    indices = torch.nonzero(used.flatten(), as_tuple=False).flatten()
    cu = F.pad(torch.cumsum(seqlens, 0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu, int(seqlens.max()), seqlens


def pad_input(hidden_states, indices, batch, seqlen):
    """The inverse: hidden_states [nnz, ...] placed at `indices` of a zero [batch, seqlen, ...]."""
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out = out.index_copy(0, indices, hidden_states)
    return out.view(batch, seqlen, *hidden_states.shape[1:])
