"""OpenRLHF's Actor (the pinned release, its own class and forward) on the tiny Qwen2 model in
bf16 on the CPU, as installed and with rlk.integrations.openrlhf.patch(): the action log-probs
and entropy from the hidden states through rlk's fused head, only the action rows. Padded and
packed (packing_samples) batches, the policy update (gradients) and the forward-only passes;
per action token within the tolerance derived below, the parameters' gradients within the
first-order bound."""
import math
import tempfile

import pytest

torch = pytest.importorskip("torch")
openrlhf = pytest.importorskip("openrlhf", reason="needs openrlhf (make trainer-test-openrlhf)")

import rlk  # noqa: E402
from rlk.integrations import _common  # noqa: E402
from rlk.integrations import openrlhf as ro  # noqa: E402

import tiny  # noqa: E402
from reference import U, U32  # noqa: E402

if not rlk.OPS["linear_logprob"].available():
    pytest.skip("the loaded librlk has no rlk_linear_logprob", allow_module_level=True)

TEMPERATURE = 0.9


@pytest.fixture(scope="module")
def model_path():
    return tiny.saved(tempfile.mkdtemp(prefix="rlk-openrlhf-"))


def actor(path, packing):
    from openrlhf.models import Actor
    return Actor(path, attn_implementation="sdpa", param_dtype="bf16", packing_samples=packing,
                 temperature=TEMPERATURE)


def batch():
    """OpenRLHF's experience layout: prompts left-padded to P, responses right-padded to A;
    action_mask [B, A] the valid response tokens (one response of one token, one empty)."""
    g = torch.Generator().manual_seed(3)
    P, A = 6, 7
    plens, rlens = [6, 2, 4, 1], [7, 3, 1, 0]
    seq = torch.zeros(len(plens), P + A, dtype=torch.int64)
    att = torch.zeros_like(seq)
    for i, (p, r) in enumerate(zip(plens, rlens)):
        seq[i, P - p:P + r] = torch.randint(3, 123, (p + r,), generator=g)
        att[i, P - p:P + r] = 1
    return seq, att, att[:, P:].clone()


def forward(a, seq, att, action_mask, patched, grad):
    """(action log-probs, entropy [B, S - 1], the final norm's output, parameter gradients of a
    weighted sum) of Actor.forward as OpenRLHF's PPO actor calls it."""
    h = ro.patch() if patched else None
    seen = {}
    hook = a.model.model.norm.register_forward_hook(lambda m, i, o: seen.update(hidden=o.detach()))
    try:
        a.model.zero_grad()
        with torch.set_grad_enabled(grad):
            lp, out = a(seq, action_mask, attention_mask=att, return_output=True, return_entropy=True)
            if grad:
                w = torch.linspace(-1, 1, lp.numel()).view(lp.shape)
                ent = out.entropy[:, -action_mask.shape[1]:]
                ((lp * w).sum() + 0.3 * (ent * w.flip(-1) * action_mask).sum()).backward()
    finally:
        hook.remove()
        if h is not None:
            h.undo()
    grads = {n: p.grad.float().clone() for n, p in a.model.named_parameters() if p.grad is not None}
    return lp.detach().double(), out.entropy.detach().double(), seen["hidden"], grads


def head_tolerance(hidden, W, labels, T):
    """Per scored row, (log-prob, entropy) tolerances between OpenRLHF's head and rlk's on the
    same bf16 hidden state h and head W (exact in fp64), z = h . W.
    OpenRLHF: its bf16 linear rounds each logit (f32 accumulation over H terms first):
    |dz_v| <= u |z_v| + H 2^-24 (|h| . |W_v|), then s = z / T in f32 (+ 2^-24 |s_v|): zeta_v.
    rlk: fp64 on the host, the outputs written in f32 (2^-24 of each).
    logp = s_y - lse(s), |d lse| <= sum_v p_v zeta_v: |dlogp| <= zeta_y + sum_v p_v zeta_v, plus
    OpenRLHF's f32 log-softmax (a V-term sum: V 2^-24 (|s_y| + |lse|)).
    The entropy H = lse - sum_v p_v s_v, dH/ds_v = -p_v (s_v - E s): |dH| <= sum_v p_v
    |s_v - E s| zeta_v, plus its f32 sums (V 2^-24 (|lse| + sum_v p_v |s_v|)) and the output's
    rounding."""
    h, W = hidden.double(), W.double()
    z = h @ W.T
    zeta = (U * z.abs() + h.shape[-1] * U32 * (h.abs() @ W.abs().T)) / T + U32 * (z / T).abs()
    s = z / T
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1)
    sy = s.gather(1, labels[:, None])[:, 0]
    V = W.shape[0]
    lp_tol = zeta.gather(1, labels[:, None])[:, 0] + (p * zeta).sum(-1) \
        + V * U32 * (sy.abs() + lse.abs()) + U32 * (sy - lse).abs()
    mean = (p * s).sum(-1, keepdim=True)
    ent = lse - mean[:, 0]
    ent_tol = (p * (s - mean).abs() * zeta).sum(-1) + V * U32 * (lse.abs() + (p * s.abs()).sum(-1)) \
        + 2 * U32 * ent.abs()
    return lp_tol, ent_tol


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_actor_forward_beside_openrlhfs(model_path, packing):
    a = actor(model_path, packing)
    seq, att, amask = batch()
    B, S = seq.shape
    A = amask.shape[1]
    before = dict(ro.head_calls)
    own = forward(a, seq, att, amask, False, True)
    mine = forward(a, seq, att, amask, True, True)
    fwd = forward(a, seq, att, amask, True, False)  # the old policy's / the reference's pass
    assert ro.head_calls["rlk"] == before.get("rlk", 0) + 2
    # the body computes the same hidden states in both (the premise of the tolerance below)
    assert torch.equal(own[2], mine[2]) and torch.equal(own[2], fwd[2])
    b, j = amask.bool().nonzero(as_tuple=True)
    cols = S - 1 - A + j
    hidden = own[2] if not packing else None
    if packing:  # OpenRLHF's packed row back in the padded layout
        from flash_attn.bert_padding import pad_input
        idx = att.flatten().nonzero()[:, 0]
        hidden = pad_input(own[2][0], idx, B, S)
    W = a.model.lm_head.weight.detach()
    lp_tol, ent_tol = head_tolerance(hidden[b, cols], W, seq[b, cols + 1], TEMPERATURE)
    for got in (mine, fwd):
        assert not got[0][~amask.bool()].any()
        err = (got[0][b, j] - own[0][b, j]).abs()
        assert (err <= lp_tol).all(), err - lp_tol
        assert ((got[1][b, cols] - own[1][b, cols]).abs() <= ent_tol).all()
    # the gradients: OpenRLHF and rlk both round the logits' gradient to bf16 for the head's
    # products (u), the probabilities differ by a factor e^zeta (2 zeta relative in p - onehot),
    # then the body's bf16 backward may round each of its D = 9 L + 2 points on a path to the
    # other neighbour (2u): eps = 2 max dlogp + 2u + 2 D u (first order, relative, no cancellation)
    eps = 2 * float(lp_tol.max()) + 2 * U + 2 * (9 * a.model.config.num_hidden_layers + 2) * U
    assert own[3].keys() == mine[3].keys()
    for n in own[3]:
        d = (own[3][n] - mine[3][n]).norm().item()
        assert d <= eps * own[3][n].norm().item() + 1e-30, "%s: %g vs %g" % (n, d, own[3][n].norm())


def test_calls_rlk_does_not_fuse_stay_openrlhfs(model_path):
    """Without an action mask (the logits asked for) the actor is OpenRLHF's own, and so it is
    when the head's weight is a DeepSpeed ZeRO-3 parameter (marked by its ds_id: partitioned
    outside lm_head's own forward, which the fused head never calls)."""
    a = actor(model_path, False)
    seq, att, amask = batch()
    h = ro.patch()
    try:
        before = ro.head_calls.copy()
        out = a(seq, None, attention_mask=att, return_output=True)
        assert out["logits"].shape == (seq.shape[0], seq.shape[1], a.model.config.vocab_size)
        assert ro.head_calls - before == {"openrlhf: log-probs of every token or the logits asked for": 1}
        a.model.lm_head.weight.ds_id = 0
        before = ro.head_calls.copy()
        a(seq, amask, attention_mask=att)
        assert ro.head_calls - before == {"openrlhf: DeepSpeed ZeRO-3 (the head's weight partitioned)": 1}
    finally:
        h.undo()
        a.model.lm_head.weight.__dict__.pop("ds_id", None)


def test_heads_that_are_not_a_plain_product_stay_openrlhfs(tmp_path):
    """A head rlk's product would get wrong stays OpenRLHF's, with OpenRLHF's log-probs bit for bit:
    a LoRA adapter on lm_head (its .weight is the base layer's alone) and a scaling of the logits
    (Granite's logits_scaling)."""
    import transformers
    from openrlhf.models import Actor
    seq, att, amask = batch()
    torch.manual_seed(5)
    lora = Actor(tiny.saved(str(tmp_path / "lora")), attn_implementation="sdpa", param_dtype="bf16",
                 lora_rank=4, lora_alpha=8, target_modules=["q_proj", "lm_head"], temperature=TEMPERATURE)
    for n, p in lora.model.named_parameters():  # a trained adapter: lora_B away from its zero init
        if "lora_B" in n:
            p.data.normal_(0, 0.5)
    cfg = transformers.GraniteConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, logits_scaling=8.0,
                                     pad_token_id=0, bos_token_id=None, eos_token_id=1)
    transformers.GraniteForCausalLM(cfg).save_pretrained(str(tmp_path / "granite"))
    granite = Actor(str(tmp_path / "granite"), attn_implementation="sdpa", param_dtype="bf16",
                    temperature=TEMPERATURE)
    for a, why in ((lora, "openrlhf: an adapter on the LM head (Linear)"),
                   (granite, "openrlhf: a logit scale (logits_scaling 8)")):
        with torch.no_grad():
            own = a(seq, amask, attention_mask=att)
            with ro.patch():
                before = ro.head_calls.copy()
                mine = a(seq, amask, attention_mask=att)
                assert ro.head_calls - before == {why: 1}, ro.head_calls - before
        assert torch.equal(own, mine)


def test_patch_reports_and_checks_the_version(monkeypatch):
    from openrlhf.models.actor import Actor
    own = Actor.forward
    h = ro.patch()
    try:
        assert h.report["version"] == "0.11.2"
        assert Actor.forward is ro.actor_forward
        assert "Actor.forward action log-probs and entropy (fused LM head)" in h.report["swapped"]
    finally:
        h.undo()
    assert Actor.forward is own
    monkeypatch.setattr(ro, "TESTED", ("0.0.1",))
    with pytest.raises(_common.UntestedVersion, match="force=True"):
        ro.patch()
    ro.patch(force=True).undo()
