"""flash_attn.utils.distributed.all_gather: the ranks' tensors concatenated along the first axis."""
import torch
import torch.distributed as dist


def all_gather(input_, process_group):
    world = dist.get_world_size(process_group)
    out = input_.new_empty(world * input_.shape[0], *input_.shape[1:])
    dist.all_gather_into_tensor(out, input_.contiguous(), group=process_group)
    return out
