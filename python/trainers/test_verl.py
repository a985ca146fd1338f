"""verl's use_fused_kernels path (the pinned release) on the tiny Qwen2 model: verl's own model
forward (verl.models.transformers.dense_common.forward_with_torch_backend, what
apply_monkey_patch installs) computes the log-probs and entropy from the hidden states through
FusedLinearForPPO, verl's torch backend beside rlk's, padded and remove-padding (packed, with
verl's shift_labels); and verl.patch() swaps agg_loss where verl's PPO path imported it."""
import math

import pytest

torch = pytest.importorskip("torch", reason="needs torch (make trainer-test installs it)")
verl = pytest.importorskip("verl", reason="needs verl (make trainer-test installs it)")

import rlk  # noqa: E402
from rlk.integrations import verl as rv  # noqa: E402

import tiny  # noqa: E402
from reference import U  # noqa: E402  (bf16's unit roundoff)

if not rlk.OPS["linear_logprob"].available():
    pytest.skip("the loaded librlk has no rlk_linear_logprob", allow_module_level=True)


def run(model, backend, ids, T, shift_labels=None, position_ids=None, prefix=False, autocast=False):
    """verl's fused forward with FusedLinearForPPO of `backend` ("torch": verl's own class,
    "rlk": patched in, with prefix sharing when `prefix`), under bf16 autocast when `autocast`;
    returns (log_probs, entropy, parameter gradients) of a weighted sum."""
    from verl.models.transformers.dense_common import forward_with_torch_backend
    import verl.utils.experimental.torch_functional as xf
    h = rv.patch(prefix=prefix) if backend == "rlk" else None
    try:
        assert (xf.FusedLinearForPPO is rv.FusedLinearForPPO) == (backend == "rlk")
        model.zero_grad()
        # use_cache=False as verl's engine passes it: with a cache transformers builds no
        # packed-sequence mask, and a remove-padding row's sequences would attend to each other
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = forward_with_torch_backend(model, input_ids=ids, position_ids=position_ids,
                                             return_dict=True, temperature=T, use_cache=False,
                                             shift_labels=shift_labels)
    finally:
        if h is not None:
            h.undo()
    lp, ent = out.log_probs, out.entropy
    w = torch.linspace(-1, 1, lp.numel()).view(lp.shape)
    ((lp * w).sum() + 0.3 * (ent.float() * w.flip(-1)).sum()).backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach().float(), ent.detach().float(), ent.dtype, grads


def bounds(model, T):
    """(logp, entropy, gradient) tolerances between verl's torch backend and rlk.
    verl forms the logits in the model's dtype: z = h . W_v rounded to bf16, then z / T rounded
    again: |d(z/T)| <= 2 u zmax / T + u^2 ... = zeta with zmax <= sqrt(H) max|gamma| max ||W_v||
    (the final RMSNorm's output has 2-norm sqrt(H) times at most max|gamma|). rlk's are exact to
    f32/fp64. logp = z_y/T - lse(z/T), lse 1-Lipschitz in the max norm: |dlogp| <= 2 zeta. The
    entropy H = lse - sum p z/T moves by at most sum_v p_v |z_v/T - E[z/T]| |d z_v/T| <=
    2 (zmax / T) zeta, and both sides round it to bf16 (verl's dtype): + 2 u |H|, H <= ln V.
    The gradient: verl rounds dz to bf16 (u), the probabilities move by a factor e^(2 zeta),
    then the backbone's backward (in the model's bf16) may round each of its D = 9 L + 2
    roundings on the path to the other neighbour (one ulp, 2u, each): eps = 2 zeta + u + 2 D u
    (first order, relative, without cancellation)."""
    cfg = model.config
    head, gamma = model.lm_head.weight.float(), model.model.norm.weight.float()
    zmax = math.sqrt(cfg.hidden_size) * gamma.abs().max().item() * head.norm(dim=1).max().item()
    zeta = 2 * U * zmax / T + U * U * zmax / T
    lp_tol = 2 * zeta
    ent_tol = 2 * (zmax / T) * zeta + 2 * U * math.log(cfg.vocab_size)
    eps = 2 * zeta + U + 2 * (9 * cfg.num_hidden_layers + 2) * U
    return lp_tol, ent_tol, eps


def check(a, b, tols):
    lp_tol, ent_tol, eps = tols
    assert (a[0] - b[0]).abs().max().item() <= lp_tol
    assert (a[1] - b[1]).abs().max().item() <= ent_tol
    assert a[2] == b[2]  # verl's entropy dtype (the hidden states')
    assert a[3].keys() == b[3].keys()
    for n in a[3]:
        d = (a[3][n] - b[3][n]).norm().item()
        assert d <= eps * a[3][n].norm().item() + 1e-30, "%s: %g vs %g" % (n, d, a[3][n].norm())


@pytest.mark.parametrize("T", [1.0, 0.7])
def test_padded_batch(T):
    model = tiny.model(dtype=torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(2))
    a = run(model, "torch", ids, T)
    b = run(model, "rlk", ids, T)
    assert a[0].shape == b[0].shape == ids.shape
    check(a, b, bounds(model, T))


def test_remove_padding():
    """The remove-padding layout: sequences packed into one row [1, nnz], positions restarting
    per sequence, labels rolled by verl (shift_labels)."""
    model = tiny.model(dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    lens = [7, 11, 4]
    seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=g) for n in lens]
    ids = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    shift = torch.roll(ids, shifts=-1, dims=-1)
    a = run(model, "torch", ids, 0.8, shift_labels=shift, position_ids=pos)
    b = run(model, "rlk", ids, 0.8, shift_labels=shift, position_ids=pos)
    assert b[0].shape == (1, sum(lens))
    check(a, b, bounds(model, 0.8))


def test_patch_swaps_agg_loss_on_the_ppo_path_only():
    import verl.trainer.ppo.core_algos as ca
    import verl.workers.utils.losses as vl
    own = vl.agg_loss
    h = rv.patch()
    try:
        assert vl.agg_loss is rv.agg_loss and vl.kl_penalty is rv.kl_penalty
        assert ca.agg_loss is own  # verl's own functions keep verl's
        assert "FusedLinearForPPO (use_fused_kernels, torch and liger backends)" in h.report["swapped"]
        assert h.report["version"] == "0.9.1"
    finally:
        h.undo()
    assert vl.agg_loss is own


def test_patch_reaches_the_engines_by_name_imports():
    """The FSDP engine and the naive rollout imported logprobs_from_logits by name before patch():
    they get rlk's too (what the report says was swapped is what runs), and verl's again after
    undo()."""
    import verl.utils.torch_functional as vf
    import verl.workers.engine.fsdp.transformer_impl as ti
    import verl.workers.rollout.naive.naive_rollout as nr
    own = vf.logprobs_from_logits
    assert ti.logprobs_from_logits is own and nr.logprobs_from_logits is own
    h = rv.patch()
    try:
        assert ti.logprobs_from_logits is rv.logprobs_from_logits and nr.logprobs_from_logits is rv.logprobs_from_logits
        assert "verl.workers.engine.fsdp.transformer_impl.logprobs_from_logits" in h.report["swapped"]
    finally:
        h.undo()
    assert ti.logprobs_from_logits is own and nr.logprobs_from_logits is own
    # one that patch() itself loads first: patched and restored as well
    import sys
    name = "verl.workers.rollout.naive.naive_rollout"
    kept = sys.modules.pop(name)
    try:
        h = rv.patch()
        try:
            assert sys.modules[name].logprobs_from_logits is rv.logprobs_from_logits
        finally:
            h.undo()
        assert sys.modules[name].logprobs_from_logits is own
    finally:
        sys.modules[name] = kept


def test_version_refused(monkeypatch):
    from rlk.integrations._common import UntestedVersion
    monkeypatch.setattr(rv, "TESTED", ("0.0.1",))
    with pytest.raises(UntestedVersion):
        rv.patch()
    rv.patch(force=True).undo()


def test_f32_operands_keep_verls_backend():
    """f32 hidden states and head without autocast: verl's own torch backend computes them."""
    g = torch.Generator().manual_seed(1)
    hs = torch.randn(2, 5, 16, generator=g, requires_grad=True)
    w = torch.randn(40, 16, generator=g)
    ids = torch.randint(0, 40, (2, 5), generator=g)
    lp, ent = rv.FusedLinearForPPO()(hs, w, ids)
    z = torch.log_softmax(hs.double() @ w.double().T, -1)
    assert (lp.double() - z.gather(-1, ids[..., None])[..., 0]).abs().max() < 1e-5


def _grpo_row(g):
    """verl's remove-padding row of a GRPO batch: groups of one prompt and its responses, each
    sequence's positions from 0; two responses of a group start alike (their common prefix runs
    past the prompt), a one-token prompt, a group of one."""
    V = tiny.config().vocab_size
    groups = [(5, [4, 9, 1]), (1, [6, 3]), (7, [5])]
    seqs = []
    for plen, lens in groups:
        prompt = torch.randint(3, V, (plen,), generator=g)
        for k, n in enumerate(lens):
            resp = torch.randint(3, V, (n,), generator=g)
            if k == 1:
                resp[:2] = seqs[-1][plen:plen + 2]
            seqs.append(torch.cat([prompt, resp]))
    ids = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(len(x)) for x in seqs])[None]
    return seqs, ids, pos


def test_prefix_sharing_in_the_remove_padding_row():
    """verl's fused forward over a remove-padding row of GRPO groups with patch(prefix=True): the
    groups' prefixes computed once (the packed backbone) beside every sequence whole (both on
    rlk's head, under bf16 autocast as verl's actor runs): per token the log-prob and entropy
    within the rounding tolerance of the fp64 reference (reference.py; test_trl_prefix.py derives
    it: LAMBDA ||c||_2 each), the parameters' gradients within the first-order relative bound
    2 max dp + 2 D u (dp: the largest token's log-prob tolerance of the two, D = 9 L + 2 bf16
    roundings on a path, each to the other neighbour at most)."""
    import reference
    from test_trl_prefix import LAMBDA
    model = tiny.model(**tiny.PREFIX_MODEL, **tiny.SENSITIVE)
    seqs, ids, pos = _grpo_row(torch.Generator().manual_seed(11))
    T = 0.8
    before = dict(rv.prefix_calls)
    a = run(model, "rlk", ids, T, position_ids=pos, autocast=True)
    b = run(model, "rlk", ids, T, position_ids=pos, prefix=True, autocast=True)
    assert rv.prefix_calls["packed"] == before.get("packed", 0) + 1
    ref = reference.Qwen2({n: p.detach() for n, p in model.named_parameters()}, model.config)
    rolled = torch.roll(ids[0], -1)
    dp, start = 0.0, 0
    with reference.one_thread():
        for x in seqs:
            n = len(x)
            r = ref.forward(x, torch.arange(n), rolled[start:start + n], T)
            b_lp, b_ent = r.bounds("logp")[:, 1], r.bounds("entropy")[:, 1]
            for got in (a, b):
                assert ((got[0][0, start:start + n].double() - r.logp).abs() <= LAMBDA * b_lp).all()
                assert ((got[1][0, start:start + n].double() - r.entropy).abs() <= LAMBDA * b_ent).all()
            dp = max(dp, float(2 * LAMBDA * b_lp.max()))
            start += n
    eps = 2 * dp + 2 * (9 * model.config.num_hidden_layers + 2) * U
    for n in a[3]:
        d = (a[3][n] - b[3][n]).norm().item()
        assert d <= eps * a[3][n].norm().item() + 1e-30, "%s: %g vs %g" % (n, d, a[3][n].norm())


def test_prefix_groups_of_a_row():
    """The row's sequences split where the positions restart, grouped to save the most tokens:
    two prompts under a common system prompt are two groups (4 tokens shared twice), not one (2
    tokens shared three times); a lone sequence and one that only starts alike stay apart."""
    from rlk.integrations import _prefix
    t = lambda *x: torch.tensor(x)  # noqa: E731
    seqs = [t(1, 1, 2, 2, 7), t(1, 1, 2, 2, 8, 9), t(1, 1, 3, 3, 4), t(1, 1, 3, 3, 5), t(6, 6), t(6, 5)]
    ids = torch.cat(seqs)
    pos = torch.cat([torch.arange(len(x)) for x in seqs])
    got, firsts = rv._sequences(ids, pos)
    assert [x.tolist() for x in got] == [x.tolist() for x in seqs] and firsts == [0] * 6
    assert _prefix.consecutive_groups(got, firsts) == [([0, 1], 4), ([2, 3], 4), ([4, 5], 1)]
    # a sequence starting at another position shares nothing with its neighbour
    assert _prefix.consecutive_groups(got[:2], [0, 3]) == [([0], 0), ([1], 0)]
