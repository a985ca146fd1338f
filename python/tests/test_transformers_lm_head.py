"""rlk.integrations.transformers.token_logprobs: a Qwen2-architecture causal LM (random weights)
scores its tokens with the LM head fused with the log-softmax (rlk.autograd.linear_token_logprob,
logits never stored) and agrees with the plain model (lm_head, then log_softmax and gather) in
log-probs and in every parameter's gradient, within bf16 rounding; prompt tokens masked out."""
import pytest

from conftest import HAVE_CUDA, HAVE_TORCH, require_host, run_example

if not HAVE_TORCH:
    pytest.skip("needs torch", allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="needs transformers (pip install transformers)")

import torch  # noqa: E402

import rlk  # noqa: E402
from rlk.integrations import transformers as rtf  # noqa: E402

PLACES = ["cpu"] + (["cuda"] if HAVE_CUDA else [])


def tiny_qwen2(device, tied):
    torch.manual_seed(4321)
    cfg = transformers.Qwen2Config(vocab_size=509, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=64, tie_word_embeddings=tied)
    return transformers.Qwen2ForCausalLM(cfg).to(device=device, dtype=torch.bfloat16)


def plain_logprobs(model, ids, labels_mask):
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(2, ids[:, 1:, None])[..., 0]
    return lp * labels_mask


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("device", PLACES)
def test_fused_head_matches_the_plain_model(device, tied):
    if not rlk.OPS["linear_logprob"].available():
        pytest.skip("the loaded librlk has no rlk_linear_logprob")
    if device == "cpu":
        require_host()
    model = tiny_qwen2(device, tied)
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, 509, (3, 21), generator=g).to(device)
    labels_mask = torch.ones(3, 20, device=device)
    labels_mask[:, :6] = 0  # the prompt
    out = []
    for fused in (False, True):
        model.zero_grad()
        lp = (rtf.token_logprobs(model, ids, labels_mask=labels_mask) if fused
              else plain_logprobs(model, ids, labels_mask))
        w = torch.linspace(-1.0, 1.0, lp.numel(), device=device).view(lp.shape)
        (lp * w).sum().backward()
        grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
        out.append((lp.detach().float(), grads))
    assert out[0][0].shape == out[1][0].shape == (3, 20)
    assert torch.all(out[1][0][:, :6] == 0)
    # measured: 1e-3 and 0.5% (the plain path rounds its logits to bf16; rlk accumulates in f32)
    err = (out[1][0] - out[0][0]).abs().max().item()
    assert err < 0.02, "log-probs differ by %g" % err
    rel = ((out[1][1] - out[0][1]).norm() / out[0][1].norm()).item()
    assert rel < 0.03, "parameter gradients differ by %g (relative norm)" % rel


def test_entropy_and_temperature(host):
    if not rlk.OPS["linear_logprob"].available():
        pytest.skip("the loaded librlk has no rlk_linear_logprob")
    model = tiny_qwen2("cpu", False)
    ids = torch.randint(0, 509, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        lp, ent = rtf.token_logprobs(model, ids, temperature=0.7, entropy=True)
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float() / 0.7
        p = torch.log_softmax(logits, -1)
        want_lp = p.gather(2, ids[:, 1:, None])[..., 0]
        want_ent = -(p.exp() * p).sum(-1)
    assert (lp - want_lp).abs().max().item() < 0.02
    assert (ent - want_ent).abs().max().item() < 0.02


def test_unscored_tokens_have_no_entropy(host):
    """A token labels_mask leaves out gets log-prob and entropy 0 (neither has a gradient there);
    the scored ones a positive entropy."""
    if not rlk.OPS["linear_logprob"].available():
        pytest.skip("the loaded librlk has no rlk_linear_logprob")
    model = tiny_qwen2("cpu", False)
    ids = torch.randint(0, 509, (2, 9), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 8)
    mask[:, :3] = 0
    lp, ent = rtf.token_logprobs(model, ids, labels_mask=mask, entropy=True)
    assert torch.all(lp[:, :3] == 0) and torch.all(ent[:, :3] == 0) and torch.all(ent[:, 3:] > 0)
    ent.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_example_agrees(host):
    lines = run_example("fused_lm_head_transformers.py", "--device", "cpu", "--batch", "4",
                        "--group", "2", "--tokens", "24", "--prompt", "8", "--vocab", "512",
                        "--iters", "1")
    assert lines[-1] == "fused and plain agree"
