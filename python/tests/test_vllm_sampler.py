"""The vLLM sampling hook's mapping (rlk.integrations.vllm) on vLLM's own input batch: requests
added to a real vllm.v1.worker.gpu_input_batch.InputBatch (on the CPU, with vLLM's built-in
logits processors) give the real SamplingMetadata; the hook's draw from it is checked row by row
against rlk.linear_sample called on that row alone with the request's own settings (tokens,
log-probs and thresholds bitwise), and against the trainer's rlk.linear_logprob; the fallback
decision names each setting the hook does not cover. The engine itself (a GPUModelRunner needs a
GPU) is not run here: patch() and its wrappers run only inside one (examples/vllm_rollout.py, which
CI does not run)."""
import importlib.metadata

import numpy as np
import pytest

from conftest import HAVE_TORCH, require_host

if not HAVE_TORCH:
    pytest.skip("needs torch", allow_module_level=True)
pytest.importorskip("vllm.v1.worker.gpu_input_batch",
                    reason="needs vLLM 0.11.0 (make vllm-test installs it, --no-deps)")

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import DeviceConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.v1.sample.logits_processor import build_logitsprocs  # noqa: E402
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

import rlk  # noqa: E402
from rlk.integrations import vllm as rlk_vllm  # noqa: E402
from rlk.integrations._common import UntestedVersion  # noqa: E402

if importlib.metadata.version("vllm") not in rlk_vllm.TESTED:
    pytest.skip("vLLM %s is not the tested %s" % (importlib.metadata.version("vllm"), rlk_vllm.TESTED),
                allow_module_level=True)

V, H, PROMPT = 1031, 96, [5, 6, 7]


def input_batch(params, outputs=None, seeds=None):
    """vLLM's InputBatch on the CPU holding one request a SamplingParams; request i has generated
    outputs[i] tokens and, where its params carry a seed, a generator seeded as vLLM's runner
    seeds it."""
    cfg = VllmConfig(scheduler_config=SchedulerConfig(max_num_seqs=16),
                     device_config=DeviceConfig(device="cpu"))
    cpu = torch.device("cpu")
    batch = InputBatch(max_num_reqs=16, max_model_len=64, max_num_batched_tokens=64, device=cpu,
                       pin_memory=False, vocab_size=V, block_sizes=[16],
                       logitsprocs=build_logitsprocs(cfg, cpu, False, False))
    for i, sp in enumerate(params):
        gen = None
        if sp.seed is not None:
            gen = torch.Generator()
            gen.manual_seed(sp.seed)
        out = [11] * (outputs[i] if outputs else 0)
        batch.add_request(CachedRequestState(
            req_id="req-%d" % i, prompt_token_ids=PROMPT, mm_features=[], sampling_params=sp,
            pooling_params=None, generator=gen, block_ids=([0],), num_computed_tokens=len(PROMPT) + len(out),
            output_token_ids=out))
    batch.refresh_metadata()
    return batch


def head(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, H, generator=g) * 2).to(torch.bfloat16)
    weight = (torch.randn(V, H, generator=g) * 0.3).to(torch.bfloat16)
    return hidden, weight


MIXED = [SamplingParams(temperature=0.7, top_k=20, seed=1234, logprobs=0),
         SamplingParams(temperature=0.0, logprobs=0),
         SamplingParams(temperature=1.0, top_p=0.8, min_p=0.02, logprobs=0),
         SamplingParams(temperature=0.7, top_p=0.9, logprobs=0),
         SamplingParams(temperature=1e-6, top_k=3, logprobs=0),
         SamplingParams(temperature=1.3, min_p=0.1, top_k=50, seed=7, logprobs=0)]
OUTPUTS = [0, 4, 9, 1, 2, 30]


def test_rows_from_the_input_batch():
    batch = input_batch(MIXED, OUTPUTS)
    rows = rlk_vllm.rows_from_input_batch(batch, seed=99)
    assert rows.temperature == [float(np.float32(p.temperature)) if p.temperature >= 1e-5 else 0.0
                                for p in MIXED]
    assert rows.offsets == OUTPUTS
    # seeded requests draw from their own seed, the others from the hook's seed and their id
    assert rows.seeds[0] == 1234 and rows.seeds[5] == 7
    others = [rows.seeds[i] for i in (1, 2, 3, 4)]
    assert others == [rlk_vllm.request_seed("req-%d" % i, 99) for i in (1, 2, 3, 4)]
    assert len(set(others)) == 4 and all(0 <= s < 2 ** 63 for s in others)
    assert rlk_vllm.request_seed("req-1", 98) != others[0]


def test_seed_bits():
    """A seed past 2^63 (torch's generators take up to 2^64 - 1) goes as the i64 with its bits."""
    sp = SamplingParams(temperature=0.5, seed=2 ** 64 - 3)
    rows = rlk_vllm.rows_from_input_batch(input_batch([sp]), seed=0)
    assert rows.seeds == [-3]


def test_plain_head_models():
    """The models whose compute_logits is the head alone (a logit scale or soft cap shows on the
    logits processor); Gemma 2's is refused."""
    from vllm.model_executor.models import gemma2, llama, qwen2, qwen3
    assert rlk_vllm.plain_compute_logits(llama.LlamaForCausalLM)
    assert rlk_vllm.plain_compute_logits(qwen2.Qwen2ForCausalLM)
    assert rlk_vllm.plain_compute_logits(qwen3.Qwen3ForCausalLM)
    assert not rlk_vllm.plain_compute_logits(gemma2.Gemma2ForCausalLM)


def test_temperature_groups():
    groups = rlk_vllm.temperature_groups([0.7, 0.0, 1.0, 0.7, 1e-6, 1.3])
    assert groups == [(0.7, [0, 3]), (0.0, [1, 4]), (1.0, [2]), (1.3, [5])]


def alone(hidden, weight, i, params, seed, offset):
    """rlk.linear_sample on row i alone with the request's settings as scalars."""
    t = params.temperature if params.temperature >= 1e-5 else 0.0
    kw = {}
    if t:
        kw = dict(top_k=params.top_k if 0 < params.top_k < V else None,
                  top_p=params.top_p if params.top_p < 1 else None,
                  min_p=params.min_p or None)
    return rlk.linear_sample(hidden[i:i + 1].contiguous(), weight, temperature=t, seed=seed, offset=offset,
                             threshold=True, **kw)


@pytest.mark.parametrize("case", ["mixed", "one temperature", "all greedy"])
def test_draw_is_each_requests_own_linear_sample(case):
    require_host()
    params = {"mixed": MIXED,
              "one temperature": [SamplingParams(temperature=0.9, top_k=k, seed=s) for k, s in
                                  [(10, 1), (-1, 2), (200, 3)]],
              "all greedy": [SamplingParams(temperature=0.0) for _ in range(3)]}[case]
    outputs = OUTPUTS[:len(params)]
    batch = input_batch(params, outputs)
    md = batch.sampling_metadata
    assert rlk_vllm.unsupported(md) is None
    hidden, weight = head(len(params))
    rows = rlk_vllm.rows_from_input_batch(batch, seed=5)
    got = rlk_vllm.draw(hidden, weight, md, rows)
    for i, p in enumerate(params):
        ref = alone(hidden, weight, i, p, rows.seeds[i], rows.offsets[i])
        assert int(got.tokens[i]) == int(ref.tokens[0]), "row %d" % i
        for a, b in ((got.logp, ref.logp), (got.threshold, ref.threshold)):
            assert a[i:i + 1].view(torch.int32).equal(b.view(torch.int32)), "row %d" % i
        # the trainer's log-prob of the token, at the request's temperature (greedy: 1)
        t = p.temperature if p.temperature >= 1e-5 else 1.0
        tr = rlk.linear_logprob(hidden[i:i + 1], weight, got.tokens[i:i + 1], temperature=t)
        assert tr.logp.view(torch.int32).equal(got.logp[i:i + 1].view(torch.int32)), "row %d" % i
        if p.temperature < 1e-5:  # greedy rows: the argmax of the head, in fp64 here
            z = hidden[i].double() @ weight.double().T
            assert int(got.tokens[i]) == int(z.argmax())


def test_min_p_reaches_the_draw():
    """min-p is a logits processor in vLLM (not a SamplingMetadata field): with a min-p that keeps
    only the top token, every offset draws the argmax."""
    require_host()
    params = [SamplingParams(temperature=1.0, min_p=0.999, seed=3), SamplingParams(temperature=1.0, seed=4)]
    batch = input_batch(params)
    hidden, weight = head(2, seed=1)
    hidden[0] = hidden[0] * 8  # a peaked row: its top token alone stays above 0.999 p_max
    z = hidden[0].double() @ weight.double().T
    top2 = z.topk(2).values
    assert float(top2[0] - top2[1]) > 1e-2  # min-p 0.999 keeps the top token alone
    for off in range(6):
        batch.num_tokens_no_spec[:2] = len(PROMPT) + off
        rows = rlk_vllm.rows_from_input_batch(batch, seed=1)
        got = rlk_vllm.draw(hidden, weight, batch.sampling_metadata, rows)
        assert int(got.tokens[0]) == int(z.argmax())
        assert float(got.threshold[1]) == -float("inf")  # row 1 keeps everything


def test_sampler_output():
    require_host()
    batch = input_batch(MIXED, OUTPUTS)
    md = batch.sampling_metadata
    hidden, weight = head(len(MIXED))
    d = rlk_vllm.draw(hidden, weight, md, rlk_vllm.rows_from_input_batch(batch, seed=5))
    logits = (hidden @ weight.T)  # what the engine's compute_logits would give: bf16
    out = rlk_vllm.sampler_output(d, md, logits)
    assert out.sampled_token_ids.dtype == torch.int32 and out.sampled_token_ids.shape == (len(MIXED), 1)
    assert out.sampled_token_ids[:, 0].long().equal(d.tokens)
    lt = out.logprobs_tensors
    assert lt.logprob_token_ids[:, 0].long().equal(d.tokens) and lt.logprobs[:, 0].equal(d.logp)
    z = logits.float().numpy()
    tok = d.tokens.numpy()
    ranks = [int((z[i] >= z[i, tok[i]]).sum()) for i in range(len(MIXED))]
    assert lt.selected_token_ranks.tolist() == ranks
    # no logprobs asked for: none returned
    plain = input_batch([SamplingParams(temperature=0.5)])
    d1 = rlk_vllm.draw(hidden[:1], weight, plain.sampling_metadata, rlk_vllm.rows_from_input_batch(plain, 0))
    assert rlk_vllm.sampler_output(d1, plain.sampling_metadata, logits[:1]).logprobs_tensors is None


@pytest.mark.parametrize("params,reason", [
    (SamplingParams(repetition_penalty=1.2), "penalties"),
    (SamplingParams(frequency_penalty=0.5), "penalties"),
    (SamplingParams(presence_penalty=0.5), "penalties"),
    (SamplingParams(logit_bias={3: 2.0}), "logit bias"),
    (SamplingParams(min_tokens=4, stop_token_ids=[2]), "min_tokens"),
    (SamplingParams(allowed_token_ids=[1, 2, 3]), "allowed token ids"),
    (SamplingParams(logprobs=3), "logprobs > 0"),
])
def test_unsupported_settings_are_named(params, reason):
    batch = input_batch([SamplingParams(temperature=0.8), params])
    why = rlk_vllm.unsupported(batch.sampling_metadata)
    assert why is not None and reason in why


def test_unsupported_bad_words_and_grammar():
    batch = input_batch([SamplingParams(temperature=0.8)])
    md = batch.sampling_metadata
    assert rlk_vllm.unsupported(md) is None
    assert "structured output" in rlk_vllm.unsupported(md, grammar=True)
    # bad words become token ids once vLLM's tokenizer has read them (no tokenizer here): set
    # on the request as vLLM's processor leaves them
    sp = SamplingParams(temperature=0.8)
    sp._bad_words_token_ids = [[17]]
    assert "bad words" in rlk_vllm.unsupported(input_batch([sp]).sampling_metadata)


def test_untested_version_refused(monkeypatch):
    """patch() checks the installed vLLM before it touches the runner."""
    monkeypatch.setattr(rlk_vllm, "TESTED", ("0.0.1",))
    with pytest.raises(UntestedVersion, match="force=True"):
        rlk_vllm.patch(None)
