"""rlk: JIT-specialized kernels for RLHF post-training, from Python.

A binding (ctypes, and a small compiled entry for repeated calls on torch tensors: rlk/_entry.py)
over librlk. Torch tensors go in zero copy (data pointer, shape,
strides, dtype, device) and run on the current CUDA stream of their device; numpy arrays and
torch CPU tensors run on the host backend. A failed call raises an rlk.RlkError subclass with
the library's message.

    import rlk
    adv = rlk.group_advantage(scores, group_size=16)              # functional, like the C API
    out = rlk.policy_loss(logp, old_logp, adv, mask)              # loss, grad_logp, metrics
    adv, ret = rlk.gae(rewards, values, mask, lam=0.95)
    lp = rlk.logprob(logits, labels, entropy=True)                # logp, lse, entropy
    lp = rlk.vocab_parallel_logprob(shard_logits, labels, group=tp_group)  # tensor-parallel
    lp = rlk.linear_logprob(hidden, lm_head_weight, labels)       # the same, logits never stored
    d = rlk.linear_divergence(h_s, w_s, h_t, w_t, mode="jsd")     # distillation, two heads
    tok = rlk.sample(logits, temperature=0.7, top_k=50, top_p=0.9, seed=seeds)  # tokens, logp
    packed, layout = rlk.pack_grpo(prompts, responses)            # [prefix | r_1 .. r_G] per prompt
    out, lse = rlk.prefix_attention(q, k, v, layout)              # prefix-shared attention

    from rlk.autograd import policy_loss                          # torch autograd (imports torch)
    loss, metrics = policy_loss(logp, old_logp, adv, mask); loss.backward()
    (rlk.autograd also has value_loss, token_logprob and prefix_attention.)

Under torch.compile every op is a torch.library operator (rlk.torch_ops, torch.ops.rlk.*): a
compiled step has no graph break. rlk.nn has modules shaped like Liger's fused losses,
rlk.sampling FlashInfer's sampling functions; the library's messages go to the "rlk" logger
(rlk.jit_summary() sums up the kernels compiled); rlk.kernel_trees makes precompiled trees into
wheels the package finds by itself.

Where the library is found: see rlk._lib (RLK_LIBRARY, the copy inside the package, the source
tree's build/lib, the system loader). Importing rlk loads it: a missing or unloadable library is
an ImportError (rlk.LibraryNotFound) that names every place tried.
"""
import sys

from ._context import Context, configure, context, jit_summary, release_contexts
from . import _lib
from ._lib import library, library_path, version_string
from ._status import BadInput, check_status, checks, set_checks, status
from ._types import Backend, DType, LogLevel
from .errors import (AbiMismatch, BackendError, CacheError, CompileError, InternalError,
                     InvalidArgument, JitDisabled, LibraryNotFound, OutOfMemory, RlkError,
                     RlkIOError, Timeout, Unavailable, Unsupported)
from .ops import OPS
from .ops.group_advantage import AdvantageMode, NanScores, SingletonPolicy, group_advantage
from .ops.losses import (POLICY_LOSS_METRICS, VALUE_LOSS_METRICS, KLEstimator, LossAgg,
                         PolicyLossMode, PolicyLossResult, ValueLossResult, metrics_dict,
                         policy_loss, value_loss)
from .ops.logprob import STATUS_BAD_LABEL, LogprobResult, LogprobVariant, logprob, logprob_backward
from .ops.vocab_parallel import (PARTIAL_FIELDS, STATUS_LABEL_OWNERS, logprob_combine,
                                 logprob_partials, nccl_comm_of, nccl_version,
                                 vocab_parallel_logprob, vocab_parallel_logprob_nccl)
from .ops.linear_divergence import (DivergenceMode, LinearDivergenceResult, linear_divergence,
                                    linear_divergence_backward, linear_divergence_combine,
                                    linear_divergence_partials)
from .ops.linear_logprob import (STATUS_BAD_ROW, LinearLogprobVariant, LinearPolicyLossResult, linear_logprob,
                                 linear_logprob_backward, linear_logprob_partials,
                                 linear_policy_loss)
from .ops.sample import (SAMPLE_ROW_SPLIT_AUTO, SAMPLE_STATUS_BAD_PARAM, SAMPLE_STATUS_NAN,
                         SAMPLE_STATUS_NO_TOKEN, SampleResult, sample)
from .ops.linear_sample import LinearSampleResult, linear_sample
from .ops.prefix_attention import (PrefixLayout, pack_grpo, prefix_attention,
                                   prefix_attention_backward, prefix_layout, unpack_responses)
from .ops.token_baseline import token_baseline
from .ops.token_kl import token_kl
from .ops.returns import (GaeMasked, ReturnsMasked, ScanAlgo, WhitenEps, WhitenMasked,
                          discounted_returns, gae, masked_whiten, reverse_cumsum)

__version__ = "0.1.0"

library()  # here, not at the first call: a package without its library fails to import
_lib.check_enums()  # every enum mirror against the library's (all of them imported above)

if "torch" in sys.modules:  # torch.ops.rlk.*; otherwise on first use (rlk.autograd, a compile)
    from . import torch_ops  # noqa: F401


def __getattr__(name):
    """rlk.autograd, rlk.nn, rlk.sampling and rlk.torch_ops import torch: loaded on first use;
    rlk.kernel_trees too (`python -m rlk.kernel_trees` runs it as a script: imported with the
    package, runpy would warn)."""
    if name in ("autograd", "nn", "sampling", "torch_ops", "kernel_trees"):
        import importlib
        return importlib.import_module("." + name, __name__)
    raise AttributeError("module 'rlk' has no attribute %r" % name)

__all__ = [
    # runtime
    "Context", "configure", "context", "jit_summary", "release_contexts", "library", "library_path",
    "version_string", "available_ops", "Backend", "DType", "LogLevel", "OPS",
    # errors
    "RlkError", "InvalidArgument", "Unsupported", "Unavailable", "CompileError", "JitDisabled",
    "CacheError", "BackendError", "OutOfMemory", "RlkIOError", "Timeout", "InternalError",
    "LibraryNotFound", "AbiMismatch",
    # bad input only the device sees
    "BadInput", "check_status", "status", "set_checks", "checks",
    # ops
    "group_advantage", "AdvantageMode", "SingletonPolicy", "NanScores", "token_baseline",
    "token_kl", "policy_loss", "value_loss", "metrics_dict", "PolicyLossResult", "ValueLossResult",
    "POLICY_LOSS_METRICS", "VALUE_LOSS_METRICS", "PolicyLossMode", "KLEstimator", "LossAgg",
    "gae", "discounted_returns", "reverse_cumsum", "masked_whiten", "ScanAlgo", "GaeMasked",
    "ReturnsMasked", "WhitenEps", "WhitenMasked",
    "linear_divergence", "linear_divergence_backward", "linear_divergence_partials",
    "linear_divergence_combine", "LinearDivergenceResult", "DivergenceMode",
    "logprob", "logprob_backward", "linear_logprob", "linear_logprob_backward", "linear_logprob_partials", "linear_policy_loss", "LinearPolicyLossResult", "LinearLogprobVariant", "LogprobResult", "LogprobVariant", "STATUS_BAD_LABEL", "STATUS_BAD_ROW",
    "vocab_parallel_logprob", "logprob_partials", "logprob_combine", "PARTIAL_FIELDS",
    "STATUS_LABEL_OWNERS", "vocab_parallel_logprob_nccl", "nccl_comm_of", "nccl_version",
    "sample", "SampleResult", "SAMPLE_STATUS_NAN", "SAMPLE_STATUS_NO_TOKEN", "SAMPLE_STATUS_BAD_PARAM",
    "SAMPLE_ROW_SPLIT_AUTO", "linear_sample", "LinearSampleResult",
    "prefix_attention", "prefix_attention_backward", "prefix_layout", "pack_grpo",
    "unpack_responses", "PrefixLayout",
]


def available_ops():
    """The op families the loaded library has (and whose structs match this package)."""
    return [name for name, op in OPS.items() if op.available()]
