"""vLLM's V1 engine sampling through rlk.linear_sample: the rollout's tokens drawn from the last
hidden states and the LM head's weight, with each token's log-prob bitwise what the trainer's
rlk.linear_logprob gives on the same hidden states. Tested against vLLM 0.11.0.

    from rlk.integrations import vllm as rlk_vllm
    llm = vllm.LLM(model, ...)                              # one GPU, no speculative decoding
    llm.collective_rpc(rlk_vllm.install_on_worker, kwargs={"record": True})
    outs = llm.generate(prompts, sampling_params)
    steps = llm.collective_rpc(rlk_vllm.take_on_worker)[0]  # per step: rows, tokens, log-probs, ...

collective_rpc runs a function in the engine's worker: directly with the in-process engine
(VLLM_ENABLE_V1_MULTIPROCESSING=0); the multiprocess one sends it, and the records back, by
pickle only with VLLM_ALLOW_INSECURE_SERIALIZATION=1.

The seam: vLLM's GPUModelRunner computes `logits = model.compute_logits(hidden_states[
logits_indices])` and then `_sample(logits, spec_decode_metadata)`, which runs its Sampler on the
logits and the input batch's SamplingMetadata. patch(runner) wraps the model's compute_logits (to
keep the hidden states the logits came from) and the runner's _sample: a step whose settings rlk
covers is drawn by rlk.linear_sample on those hidden states and the head's weight and returned as
vLLM's SamplerOutput (the tokens; with logprobs=0 requested, each token's log-prob and rank). The
general plugin entry point (`vllm.general_plugins`, register()) installs the same hook in every
runner a process loads when RLK_VLLM_SAMPLER is set.

What a step maps to: the requests are grouped by temperature (rlk takes one a call; vLLM's
greedy requests, temperature below 1e-5, are temperature 0: the argmax, scored at temperature 1),
one rlk.linear_sample a group; top-k, top-p and min-p go per row (rlk's filters follow vLLM's
order: min-p, top-k, top-p; ties at a threshold kept). Each row draws with its own Philox seed
at offset = the tokens its request has generated so far, so a request's draws do not depend on
the batch around it: a request's seed where it set one (its generator's initial seed), else one
derived from the request id and the hook's seed. The draws are rlk's, not those of vLLM's
torch generators: a seeded request is reproducible under the hook, not equal to vLLM's own draw.

The log-prob the hook returns is the sampled token's under the temperature-scaled head over the
whole vocabulary (rlk.linear_logprob at the request's temperature, greedy rows at 1), whatever
the engine's logprobs_mode; its rank is counted on the engine's logits. With record=True each
step keeps, on the device, its request ids, offsets, tokens, log-probs, kept-set thresholds (for
the trainer's kept-set replay: rlk.linear_logprob(..., threshold=)) and, with record="hidden",
the hidden states; take() hands them over. Rows whose token vLLM discards (a prompt still being
prefilled in chunks) are left out.

Not covered, refused when the hook is installed (Unsupported): speculative decoding (its
rejection sampler draws from the engine's logits), tensor or pipeline parallelism (the head is
a vocabulary shard), async scheduling, LoRA, pooling models, a model whose compute_logits is more
than the plain head (logit scale, soft cap, bias, quantized head, anything else in its
compute_logits), heads other than bf16 or f16, logprobs_mode raw_logits or processed_logits.
Not covered per step, where the step goes to vLLM's own Sampler with fallback=True and raises
Unsupported otherwise (never a silently different draw): repetition, frequency and presence
penalties; logit bias; min_tokens; bad words; allowed token ids; structured output (grammar
bitmasks); custom logits processors; more than the sampled token's log-prob (logprobs > 0).
hook.report["fallbacks"] counts the steps vLLM drew, by reason.

What it costs and what it is not: the engine still computes its own logits (vLLM's fallback,
grammar bitmasks and the ranks read them); rlk's head runs beside that GEMM, not instead of it.
The contract's boundary is the hidden states: they are vLLM's (its kernels, its batch shapes); a
trainer that recomputes them in its own forward scores other hidden states. Keep the rollout's
(record="hidden") or make both forwards alike. A row with a NaN or infinite logit gets token -1.
"""
import collections
import hashlib
import inspect
import logging
import os
import random

import torch

from ..ops.linear_sample import linear_sample
from ._common import Patch, all_or_nothing, check_version

__all__ = ["TESTED", "Unsupported", "Rows", "Drawn", "Step", "rows_from_input_batch", "unsupported",
           "temperature_groups", "draw", "sampler_output", "plain_compute_logits", "check_runner", "patch",
           "install_on_worker", "take_on_worker", "register"]

TESTED = ("0.11.0",)

# vLLM's _SAMPLING_EPS: a request with a temperature below it is greedy
GREEDY_BELOW = 1e-5

log = logging.getLogger(__name__)


class Unsupported(RuntimeError):
    """What the hook does not cover (at install, or a step's settings without fallback)."""


# Host-side per-row settings of a step (lists, one entry a request row): temperature (vLLM's),
# seed (rlk's Philox key) and offset (the tokens the request has generated so far).
Rows = collections.namedtuple("Rows", "temperature seeds offsets")

# A step's draw: tokens [n] i64, logp [n] f32, threshold [n] f32 (or None), on the device.
Drawn = collections.namedtuple("Drawn", "tokens logp threshold")

# What record=True keeps of a step: req_ids and offsets (host lists), tokens, logp, threshold
# and hidden (or None) on the device, rows in the same order.
Step = collections.namedtuple("Step", "req_ids offsets tokens logp threshold hidden")


def request_seed(req_id, seed):
    """The Philox seed of a request that set none: from the hook's seed and its request id."""
    d = hashlib.blake2b(("%d:%s" % (seed, req_id)).encode(), digest_size=8).digest()
    return int.from_bytes(d, "little") >> 1


def _i64(seed):
    """A seed (torch's generators take 0 to 2^64 - 1) as the i64 with its bits, as rlk reads it."""
    seed &= (1 << 64) - 1
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def rows_from_input_batch(batch, seed):
    """Rows from vLLM's InputBatch, from its host arrays (nothing is read from the device):
    temperature_cpu, the seeded requests' generators, num_tokens_no_spec - num_prompt_tokens."""
    n = batch.num_reqs
    temps = [float(t) for t in batch.temperature_cpu[:n]]
    gens = batch.generators
    seeds = [_i64(gens[i].initial_seed()) if i in gens else request_seed(r, seed)
             for i, r in enumerate(batch.req_ids[:n])]
    offsets = [int(a - b) for a, b in zip(batch.num_tokens_no_spec[:n], batch.num_prompt_tokens[:n])]
    return Rows(temps, seeds, offsets)


def _min_p_processor(metadata):
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
    for p in metadata.logitsprocs.argmax_invariant:
        if isinstance(p, MinPLogitsProcessor):
            return p
    return None


def unsupported(metadata, grammar=False):
    """Why rlk cannot draw a step with these settings (vLLM SamplingMetadata), or None. grammar:
    the step carries a structured-output bitmask (it lives on the scheduler's output)."""
    from vllm.v1.sample.logits_processor import builtin as B
    why = []
    if not metadata.no_penalties:
        why.append("repetition, frequency or presence penalties")
    if metadata.allowed_token_ids_mask is not None:
        why.append("allowed token ids")
    if metadata.bad_words_token_ids:
        why.append("bad words")
    if metadata.max_num_logprobs:
        why.append("logprobs > 0 (the top tokens' log-probs)")
    if grammar:
        why.append("structured output (a grammar bitmask)")
    for p in metadata.logitsprocs.non_argmax_invariant:
        if isinstance(p, B.LogitBiasLogitsProcessor):
            if p.biases:
                why.append("logit bias")
        elif isinstance(p, B.MinTokensLogitsProcessor):
            if p.min_toks:
                why.append("min_tokens")
        else:
            why.append("logits processor %s" % type(p).__name__)
    for p in metadata.logitsprocs.argmax_invariant:
        if not isinstance(p, B.MinPLogitsProcessor):
            why.append("logits processor %s" % type(p).__name__)
    return "; ".join(why) or None


def temperature_groups(temperatures):
    """[(rlk temperature, [row indices])] in order of first appearance: one rlk call a distinct
    temperature, vLLM's greedy requests (below GREEDY_BELOW) at 0."""
    groups = {}
    for i, t in enumerate(temperatures):
        groups.setdefault(0.0 if t < GREEDY_BELOW else float(t), []).append(i)
    return list(groups.items())


def _rows_of(x, sel):
    return None if x is None else (x if sel is None else x.index_select(0, sel))


def draw(hidden, weight, metadata, rows, *, threshold=True):
    """The step's tokens from hidden [n, H] (the rows' last hidden states) and weight [V, H] (the
    head), settings from metadata (vLLM SamplingMetadata: top_k, top_p, min-p's processor) and
    rows: one rlk.linear_sample a temperature group. Returns Drawn. Nothing is read back; the
    per-row seeds and offsets are copied to the device."""
    n, dev = hidden.shape[0], hidden.device
    seeds = torch.tensor(rows.seeds, dtype=torch.int64).to(dev, non_blocking=True)
    offsets = torch.tensor(rows.offsets, dtype=torch.int64).to(dev, non_blocking=True)
    mp = _min_p_processor(metadata)
    min_p = mp.min_p[:n, 0] if mp is not None and mp.min_p_count else None
    groups = temperature_groups(rows.temperature)
    out = None
    for temp, idx in groups:
        sel = None if len(groups) == 1 else torch.tensor(idx, dtype=torch.int64).to(dev, non_blocking=True)
        filters = {} if temp == 0.0 else dict(top_k=_rows_of(metadata.top_k, sel),
                                              top_p=_rows_of(metadata.top_p, sel),
                                              min_p=_rows_of(min_p, sel))
        r = linear_sample(_rows_of(hidden, sel).contiguous(), weight, temperature=temp,
                          seed=_rows_of(seeds, sel), offset=_rows_of(offsets, sel),
                          threshold=threshold, **filters)
        if sel is None:
            return Drawn(r.tokens, r.logp, r.threshold)
        if out is None:
            out = Drawn(torch.empty(n, dtype=torch.int64, device=dev),
                        torch.empty(n, dtype=torch.float32, device=dev),
                        torch.empty(n, dtype=torch.float32, device=dev) if threshold else None)
        for full, part in zip(out, (r.tokens, r.logp, r.threshold)):
            if full is not None:
                full.index_copy_(0, sel, part)
    return out


def sampler_output(drawn, metadata, logits):
    """vLLM's SamplerOutput of a draw: the tokens [n, 1] i32 and, where logprobs were asked for
    (max_num_logprobs 0), each token's log-prob and its rank among the engine's logits (1 + the
    logits above it, vLLM's count)."""
    from vllm.v1.outputs import LogprobsTensors, SamplerOutput
    tok = drawn.tokens.to(torch.int32)[:, None]
    lp = None
    if metadata.max_num_logprobs is not None:
        z = logits.float()
        mine = z.gather(1, drawn.tokens[:, None].clamp(min=0))
        lp = LogprobsTensors(tok, drawn.logp[:, None], (z >= mine).sum(-1))
    return SamplerOutput(sampled_token_ids=tok, logprobs_tensors=lp)


_PLAIN_LOGITS = ["logits = self.logits_processor(self.lm_head, hidden_states)", "return logits"]


def plain_compute_logits(model_class):
    """Whether a vLLM model class's compute_logits is the plain head: its body is
    `logits = self.logits_processor(self.lm_head, hidden_states)` and `return logits`."""
    try:
        src = inspect.getsource(model_class.compute_logits).splitlines()
    except (OSError, TypeError):
        return False
    body = [s.strip() for s in src if s.strip()]
    ends = [i for i, s in enumerate(body) if s.endswith(":") and ("->" in s or s.startswith("def "))]
    return bool(ends) and body[ends[0] + 1:] == _PLAIN_LOGITS


def check_runner(runner):
    """(reasons, weight): why the hook cannot serve this GPUModelRunner (its configuration or its
    model's head; empty: it can), and the head's weight [V, H] (None where there is no plain head)."""
    why = []
    if runner.speculative_config is not None:
        why.append("speculative decoding (its rejection sampler draws from the engine's logits)")
    pc = runner.parallel_config
    if pc.tensor_parallel_size != 1 or pc.pipeline_parallel_size != 1:
        why.append("tensor or pipeline parallelism (the head is a vocabulary shard)")
    if runner.use_async_scheduling:
        why.append("async scheduling (a request's token count trails its draws)")
    if runner.lora_config is not None:
        why.append("LoRA (an adapted head, extra vocabulary)")
    if runner.is_pooling_model:
        why.append("a pooling model (nothing is sampled)")
    if runner.model_config.logprobs_mode in ("raw_logits", "processed_logits"):
        why.append("logprobs_mode %s (the hook returns log-probs)" % runner.model_config.logprobs_mode)
    model = runner.get_model()
    head, proc = getattr(model, "lm_head", None), getattr(model, "logits_processor", None)
    if head is None or proc is None or not plain_compute_logits(type(model)):
        why.append("%s.compute_logits is not logits_processor(lm_head, hidden_states)" % type(model).__name__)
        return why, None
    if proc.scale != 1.0 or proc.soft_cap is not None or proc.logits_as_input:
        why.append("a logit scale, soft cap or logits as input")
    if getattr(head, "bias", None) is not None:
        why.append("a head with a bias")
    if type(getattr(head, "quant_method", None)).__name__ != "UnquantizedEmbeddingMethod":
        why.append("a quantized head")
    w = head.weight
    if w.dtype not in (torch.bfloat16, torch.float16):
        why.append("a %s head (rlk's reads bf16 or f16)" % w.dtype)
    return why, w[:proc.org_vocab_size]


class Hook(Patch):
    """patch()'s handle: undo() restores the runner; report: "version", "swapped", "left",
    "fallbacks" (a Counter of the steps vLLM drew, by reason); take(): the recorded steps."""

    def __init__(self):
        super().__init__()
        self.report["fallbacks"] = collections.Counter()
        self.steps = []

    def take(self):
        """The recorded steps (list of Step), oldest first; the record is emptied."""
        steps, self.steps = self.steps, []
        return steps


def patch(runner, *, fallback=False, record=False, seed=None, force=False):
    """Routes the sample step of vLLM's GPUModelRunner `runner` through rlk.linear_sample.

    fallback: a step with settings the hook does not cover goes to vLLM's own Sampler (counted in
    report["fallbacks"]); otherwise it raises Unsupported. record: True keeps each step's rows
    (Step, without hidden states), "hidden" with them. seed: the seed requests without one draw
    from (random by default). Refuses a vLLM other than TESTED unless force, and a configuration
    the hook does not cover (Unsupported, naming every reason). Returns a Hook."""
    h = Hook()
    h.report["version"] = check_version("vllm", TESTED, force)
    why, weight = check_runner(runner)
    if why:
        raise Unsupported("rlk: the vLLM sampling hook does not cover " + "; ".join(why))
    base = random.getrandbits(62) if seed is None else int(seed)
    model = runner.get_model()
    own_logits, own_sample, own_execute = model.compute_logits, runner._sample, runner.execute_model
    last = {}

    def compute_logits(hidden_states, *args, **kwargs):
        logits = own_logits(hidden_states, *args, **kwargs)
        last["hidden"], last["logits"] = hidden_states, logits
        return logits

    def execute_model(scheduler_output, *args, **kwargs):
        last["grammar"] = getattr(scheduler_output, "grammar_bitmask", None) is not None
        return own_execute(scheduler_output, *args, **kwargs)

    def sample(logits, spec_decode_metadata):
        md = runner.input_batch.sampling_metadata
        why = unsupported(md, last.get("grammar", False))
        if why is None and (spec_decode_metadata is not None or logits is None
                            or logits is not last.get("logits")):
            why = "logits that did not come from the hooked compute_logits"
        if why is not None:
            if not fallback:
                raise Unsupported("rlk: a step the vLLM sampling hook does not cover: " + why)
            if not h.report["fallbacks"]:
                log.warning("rlk: vLLM draws steps with %s (fallback=True)", why)
            h.report["fallbacks"][why] += 1
            return own_sample(logits, spec_decode_metadata)
        hidden = last["hidden"]
        rows = rows_from_input_batch(runner.input_batch, base)
        d = draw(hidden, weight, md, rows, threshold=True)
        if record:
            _record(h, runner, rows, d, hidden if record == "hidden" else None)
        return sampler_output(d, md, logits)

    with all_or_nothing(h):  # a runner that takes one attribute and refuses the next: none set
        h.set(model, "compute_logits", compute_logits)
        h.set(runner, "execute_model", execute_model)
        h.set(runner, "_sample", sample)
    h.swapped("GPUModelRunner._sample: rlk.linear_sample from the sampled rows' hidden states")
    h.left("the engine's logits", "still computed by vLLM (fallback, grammar bitmasks, ranks)")
    h.left("penalties, logit bias, min_tokens, bad words, allowed token ids, structured output, "
           "custom logits processors, logprobs > 0",
           "vLLM's Sampler with fallback=True, else Unsupported")
    return h


def _record(h, runner, rows, d, hidden):
    """Keeps a step's rows but those whose token vLLM discards (a chunked prefill's)."""
    n = len(rows.offsets)
    gone = set(int(i) for i in runner.discard_request_indices.np[:runner.num_discarded_requests])
    keep = [i for i in range(n) if i not in gone]
    req_ids = runner.input_batch.req_ids[:n]
    if len(keep) != n:
        sel = torch.tensor(keep, dtype=torch.int64).to(d.tokens.device, non_blocking=True)
        d = Drawn(*(x.index_select(0, sel) for x in d))
        hidden = None if hidden is None else hidden.index_select(0, sel)
    h.steps.append(Step([req_ids[i] for i in keep], [rows.offsets[i] for i in keep],
                        d.tokens, d.logp, d.threshold, hidden))


def install_on_worker(worker, **options):
    """patch() on a vLLM worker's model runner; for LLM.collective_rpc(install_on_worker,
    kwargs=options), which runs it in every worker process. Returns the hook's report."""
    worker._rlk_sampling_hook = patch(worker.model_runner, **options)
    return dict(worker._rlk_sampling_hook.report)


def take_on_worker(worker):
    """The worker's recorded steps (Hook.take), their tensors moved to the host; for
    LLM.collective_rpc(take_on_worker)."""
    steps = worker._rlk_sampling_hook.take()
    return [Step(s.req_ids, s.offsets, *(None if x is None else x.cpu() for x in s[2:])) for s in steps]


def register():
    """vLLM's general plugin entry point: with RLK_VLLM_SAMPLER set ("1", or "fallback" for
    fallback=True), every GPUModelRunner the process loads gets the hook after load_model (its
    handle on runner._rlk_sampling_hook). Patches nothing otherwise (the import that reaches it
    has loaded rlk's library and registered its torch ops)."""
    mode = os.environ.get("RLK_VLLM_SAMPLER", "")
    if mode in ("", "0"):
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    own = GPUModelRunner.load_model
    if getattr(own, "_rlk_hooked", False):
        return

    def load_model(self, *args, **kwargs):
        own(self, *args, **kwargs)
        self._rlk_sampling_hook = patch(self, fallback=mode == "fallback")

    load_model._rlk_hooked = True
    GPUModelRunner.load_model = load_model
