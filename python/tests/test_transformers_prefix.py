"""rlk.integrations.transformers: a Qwen2-architecture causal LM (random weights, no download)
scores GRPO responses with the prompt processed once ("rlk_prefix" attention over the packed
group) and agrees with the replicated batch ([prompt; response] each, SDPA) in log-probs and in
the parameters' gradients, within bf16 rounding."""
import pytest

from conftest import HAVE_CUDA, HAVE_TORCH, require_host, run_example

if not HAVE_TORCH:
    pytest.skip("needs torch", allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="needs transformers (pip install transformers)")

import torch  # noqa: E402

import rlk  # noqa: E402
from rlk.integrations import transformers as rtf  # noqa: E402


def tiny_qwen2(device):
    torch.manual_seed(1234)
    cfg = transformers.Qwen2Config(vocab_size=311, hidden_size=256, intermediate_size=384,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                                   rope_theta=50.0, initializer_range=0.08)
    return transformers.Qwen2ForCausalLM(cfg).to(device=device, dtype=torch.bfloat16)


def replicated_logprobs(model, prompts, responses):
    out = []
    for p, rs in zip(prompts, responses):
        group = []
        for r in rs:
            logits = model(input_ids=torch.cat([p, r])[None], use_cache=False).logits[0].float()
            lp = torch.log_softmax(logits, -1)[len(p) - 1:len(p) + len(r) - 1]
            group.append(lp.gather(1, r[:, None])[:, 0])
        out.append(group)
    return out


def batch(device, gen):
    lens = [(17, [1, 9, 4]), (5, [6, 3]), (1, [2])]
    prompts = [torch.randint(0, 311, (lp,), generator=gen).to(device) for lp, _ in lens]
    responses = [[torch.randint(0, 311, (n,), generator=gen).to(device) for n in rs] for _, rs in lens]
    return prompts, responses


PLACES = ["cpu"] + (["cuda"] if HAVE_CUDA else [])


@pytest.mark.parametrize("device", PLACES)
def test_shared_prefix_matches_replicated(device):
    if not rlk.OPS["prefix_attention"].available():
        pytest.skip("the loaded librlk has no rlk_prefix_attention")
    if device == "cpu":
        require_host()
    rtf.register()
    model = tiny_qwen2(device)
    prompts, responses = batch(device, torch.Generator().manual_seed(7))
    grads, logps = [], []
    for impl in ("sdpa", rtf.NAME):
        model.set_attn_implementation(impl)
        model.zero_grad()
        lp = (replicated_logprobs(model, prompts, responses) if impl == "sdpa"
              else rtf.response_logprobs(model, prompts, responses))
        flat = torch.cat([x for g in lp for x in g])
        w = torch.linspace(-1.0, 1.0, flat.numel(), device=device)
        (flat * w).sum().backward()
        logps.append(flat.detach().float())
        grads.append(torch.cat([p.grad.float().flatten() for p in model.parameters()]))
    assert logps[0].shape == logps[1].shape
    # bf16 activations: about 0.04 and 1.5% apart here; positions that did not continue from
    # the prompt (or a response seeing another) would be 1.7 and 70% apart (small rope_theta and
    # large weights make this model sensitive to both)
    err = (logps[1] - logps[0]).abs().max().item()
    assert err < 0.2, "log-probs differ by %g" % err
    rel = ((grads[1] - grads[0]).norm() / grads[0].norm()).item()
    assert rel < 0.1, "parameter gradients differ by %g (relative norm)" % rel


def test_layout_is_required():
    if not rlk.OPS["prefix_attention"].available():
        pytest.skip("the loaded librlk has no rlk_prefix_attention")
    rtf.register()
    model = tiny_qwen2("cpu")
    model.set_attn_implementation(rtf.NAME)
    with pytest.raises(ValueError, match="rlk_layout"):
        model(input_ids=torch.zeros(1, 4, dtype=torch.int64), use_cache=False)


@pytest.mark.parametrize("empty", [0, 1])
def test_an_empty_prompt_is_refused(empty):
    # a response's first token is scored from its prompt's last position: an empty prompt has
    # none (the packed row before it is another prompt's, or there is none)
    if not rlk.OPS["prefix_attention"].available():
        pytest.skip("the loaded librlk has no rlk_prefix_attention")
    require_host()
    rtf.register()
    model = tiny_qwen2("cpu")
    model.set_attn_implementation(rtf.NAME)
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([9, 10])]
    prompts[empty] = torch.tensor([], dtype=torch.int64)
    responses = [[torch.tensor([1, 2])], [torch.tensor([3, 4]), torch.tensor([8])]]
    with torch.no_grad(), pytest.raises(ValueError, match="prompt %d is empty" % empty):
        rtf.response_logprobs(model, prompts, responses)


def test_packed_positions_continue_from_the_prompt():
    ids, pos, layout = rtf.packed_inputs([torch.tensor([5, 6, 7])],
                                         [[torch.tensor([1, 2]), torch.tensor([3])]])
    assert ids.tolist() == [[5, 6, 7, 1, 2, 3]]
    assert pos.tolist() == [[0, 1, 2, 3, 4, 3]]
    assert layout.response_ranges(0) == [(3, 5), (5, 6)]


def test_example_agrees(host):
    lines = run_example("grpo_prefix_transformers.py", "--device", "cpu", "--prompts", "2",
                        "--group", "3", "--prefix", "24", "--response", "8", "--iters", "1")
    assert lines[-1] == "shared and replicated agree"


def test_softcapping_and_sinks_are_refused():
    """What the kernels do not apply is refused, never dropped: share() leaves a model with
    attention logit softcapping (Gemma2's, all its layers full attention here) as it is, and the
    attention function refuses a softcap or sinks (s_aux) it is handed."""
    cfg = transformers.Gemma2Config(vocab_size=64, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                    layer_types=["full_attention"] * 2, attn_logit_softcapping=50.0)
    model = transformers.Gemma2ForCausalLM(cfg)
    assert "softcapping" in (rtf.share(model) or "")
    assert not model.config._attn_implementation.startswith(rtf.NAME)
    lay = rlk.prefix_layout([3], [[2]])
    q = torch.zeros(1, 2, lay.tokens, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 1, lay.tokens, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="softcapping"):
        rtf.prefix_attention_forward(None, q, k, k, None, rlk_layout=lay, softcap=50.0)
    with pytest.raises(ValueError, match="sinks"):
        rtf.prefix_attention_forward(None, q, k, k, None, rlk_layout=lay, s_aux=torch.zeros(2))
