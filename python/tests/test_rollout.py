"""The rollout loop that proves it: a small random Qwen2-architecture model decodes with
rlk.linear_sample (rlk.integrations.rollout.decode: KV cache, one row of hidden states a request
and step), then the trainer's rlk.linear_logprob scores every token from the same hidden states in
one shuffled batch: 100% of the log-probs (and lse, entropy) are the rollout's bits. Kept-set
replay of the rollout's thresholds gives each token its log-prob over its kept set, at least the
plain one, and the plain one exactly where a row kept everything. On the CPU here (the host
backend); on CUDA too where a GPU is present."""
import pytest

from conftest import HAVE_CUDA, HAVE_TORCH, require_host

if not HAVE_TORCH:
    pytest.skip("needs torch", allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="needs transformers (pip install transformers)")

import torch  # noqa: E402

import rlk  # noqa: E402
from rlk.integrations import rollout  # noqa: E402

PLACES = ["cpu"] + (["cuda"] if HAVE_CUDA else [])


def tiny_qwen2(device):
    torch.manual_seed(77)
    cfg = transformers.Qwen2Config(vocab_size=1031, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                   head_dim=64, tie_word_embeddings=False)
    return transformers.Qwen2ForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()


@pytest.mark.parametrize("device", PLACES)
def test_trainer_logprobs_are_the_rollouts(device):
    if device == "cpu":
        require_host()
    model = tiny_qwen2(device)
    B, P, T, temp = 5, 7, 12, 0.8
    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(0, 1031, (B, P), generator=g).to(device)
    seeds = torch.randint(0, 2 ** 62, (B,), generator=g).to(device)
    out = rollout.decode(model, prompts, T, temperature=temp, top_k=50, top_p=0.9, seeds=seeds)
    assert out.tokens.shape == (B, T) and out.hidden.shape == (B, T, 128)
    # a row's tokens do not depend on the batch around it: row 2 decoded alone
    alone = rollout.decode(model, prompts[2:3], T, temperature=temp, top_k=50, top_p=0.9, seeds=seeds[2:3])
    assert torch.equal(alone.tokens[0], out.tokens[2])

    # the trainer: every token in one batch, shuffled
    perm = torch.randperm(B * T, generator=g).to(device)
    hidden = out.hidden.reshape(B * T, -1)[perm]
    labels = out.tokens.reshape(-1)[perm]
    weight = rollout.head_weight(model)
    lp = rlk.linear_logprob(hidden, weight, labels, temperature=temp)
    roll = out.logp.reshape(-1)[perm]
    equal = (lp.logp.view(torch.int32) == roll.view(torch.int32)).float().mean().item()
    assert equal == 1.0, "%.1f%% of the tokens bitwise equal" % (100 * equal)

    # kept-set replay: over each token's kept set (top-k 50, top-p 0.9), at least the plain log-prob
    # and at most 0, up to each call's fold error: 2 V + 64 roundings of the sum of exponentials
    # and 16 of the row's magnitudes (tests/test_kept_set.c's bounds; the host's fp64 kernel is far
    # inside them)
    thr = out.threshold.reshape(-1)[perm]
    kept = rlk.linear_logprob(hidden, weight, labels, temperature=temp, threshold=thr)
    u = 2.0 ** -24
    tol = (2 * 1031 + 64) * u + 16 * u * (lp.logp.abs() + lp.lse.abs() + 1)
    assert torch.all(kept.logp >= lp.logp - 2 * tol) and torch.all(kept.logp <= tol)
    assert torch.equal(torch.isinf(thr), torch.zeros_like(thr, dtype=torch.bool))  # every row was cut
    every = rlk.linear_logprob(hidden, weight, labels, temperature=temp,
                               threshold=torch.full_like(thr, -float("inf")))
    assert torch.equal(every.logp, lp.logp)


@pytest.mark.parametrize("head", ["softcap", "scale", "bias"])
def test_decode_refuses_a_head_it_does_not_fuse(head):
    """A head whose logits are not hidden @ W (a softcap, a logit scale, a bias) is refused, not
    sampled from hidden @ W / T."""
    model = tiny_qwen2("cpu")
    if head == "softcap":
        model.config.final_logit_softcapping = 30.0
    elif head == "scale":
        model.config.logit_scale = 0.5
    else:
        lm = model.get_output_embeddings()
        biased = torch.nn.Linear(lm.in_features, lm.out_features, bias=True, dtype=lm.weight.dtype)
        model.set_output_embeddings(biased)
    prompts = torch.randint(0, 1031, (2, 4))
    with pytest.raises(ValueError, match={"softcap": "softcap", "scale": "logit scale",
                                          "bias": "bias"}[head]):
        rollout.decode(model, prompts, 3)
