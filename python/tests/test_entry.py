"""The compiled entry (rlk/_entry.py): a call through a kept plan gives the Python path's
results bit for bit, with fresh tensors, numbers and places; anything a plan did not see takes
the Python path."""
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rlk  # noqa: E402
from rlk import _entry  # noqa: E402
from conftest import HAVE_CUDA, require_host  # noqa: E402

_CXX = any(shutil.which(c) for c in (os.environ.get("CXX") or "c++", "g++", "clang++"))


@pytest.fixture(scope="module")
def entry():
    if os.environ.get("RLK_TORCH_ENTRY", "1").lower() in ("0", "off", "no", "false"):
        pytest.skip("RLK_TORCH_ENTRY turns the compiled entry off")
    if not _CXX:
        pytest.skip("no C++ compiler to build the compiled entry with")
    m = _entry.wait()
    assert m is not None, _entry.status()  # with a compiler and torch's headers, it builds
    return m


@pytest.fixture
def python_path():
    """Runs the body's calls through the Python path alone."""
    def run(fn):
        saved = _entry._state["module"]
        _entry._state["module"] = None
        try:
            return fn()
        finally:
            _entry._state["module"] = saved
    return run


class _PythonPathRan(AssertionError):
    pass


@pytest.fixture
def plans_only(monkeypatch):
    """Runs the body's calls with the Python path refused: each must be served by a plan."""
    from rlk import _tensor

    def run(fn):
        def refuse(self, op):
            raise _PythonPathRan("%s took the Python path" % op.name)
        with monkeypatch.context() as m:
            m.setattr(_tensor.Binder, "__init__", refuse)
            return fn()
    return run


DEVICES = ["cpu"] + (["cuda"] if HAVE_CUDA else [])


@pytest.fixture(autouse=True)
def _host_for_cpu(request):
    """A case on CPU tensors (every case without a dev of "cuda") needs the host backend."""
    spec = getattr(request.node, "callspec", None)
    if (spec.params.get("dev", "cpu") if spec else "cpu") == "cpu":
        require_host()


def inputs(dev, B=7, T=13, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64).to(dtype) - 0.1
    x = {"logp": logp, "old": logp + 0.05 * torch.randn(B, T, generator=g, dtype=dtype),
         "adv": torch.randn(B, T, generator=g, dtype=dtype),
         "mask": torch.rand(B, T, generator=g) > 0.25,
         "ref": logp + 0.05 * torch.randn(B, T, generator=g, dtype=dtype),
         "ent": torch.rand(B, T, generator=g, dtype=dtype) * 3}
    return {k: v.to(dev) for k, v in x.items()}


# (name, keywords from the inputs): every layout of outputs a plan keeps and each kind of
# normalizer
CASES = [
    ("defaults", lambda x: {}),
    ("kl and clip", lambda x: dict(ref_logp=x["ref"], kl_coef=1e-3, clip_high=0.28)),
    ("token normalizer number", lambda x: dict(token_normalizer=float(x["mask"].sum()))),
    ("token normalizer tensor", lambda x: dict(token_normalizer=x["mask"].sum().double())),
    ("seq-mean with numbers", lambda x: dict(agg="seq-mean-token-mean", seq_normalizer=5.0,
                                             token_normalizer=40.0)),
    ("scalar loss", lambda x: dict(scalar_loss=True)),
    ("apart", lambda x: dict(apart=True)),
    ("no metrics", lambda x: dict(metrics=False)),
    ("entropy bonus", lambda x: dict(entropy=x["ent"], entropy_coef=0.01)),
    ("per-sequence advantages", lambda x: dict(advantages=x["adv"][:, 0].contiguous())),
    ("gspo", lambda x: dict(mode="gspo")),
]


def call(x, kw):
    kw = dict(kw)
    adv = kw.pop("advantages", x["adv"])
    return rlk.policy_loss(x["logp"], x["old"], adv, x["mask"], **kw)


def assert_same(got, want):
    assert type(got) is type(want)
    for g, w in zip(got, want):
        if w is None:
            assert g is None
            continue
        assert g.shape == w.shape and g.dtype == w.dtype and g.device == w.device
        assert g.stride() == w.stride()
        assert torch.equal(g, w), (g, w)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
def test_plan_equals_python_path(entry, python_path, plans_only, dev, name, kw):
    _entry.forget()
    x = inputs(dev)
    call(x, kw(x))  # the Python path, which keeps the plan
    assert len(_entry.plans) == 1, "no plan kept for %s" % name
    # fresh tensors (other data pointers) and numbers each call, through the plan
    for seed in (1, 2):
        y = inputs(dev, seed=seed)
        got = plans_only(lambda: call(y, kw(y)))
        want = python_path(lambda: call(y, kw(y)))
        assert_same(got, want)


@pytest.mark.parametrize("dev", DEVICES)
def test_what_a_plan_did_not_see_takes_the_python_path(entry, python_path, dev):
    _entry.forget()
    x = inputs(dev)
    call(x, {})
    assert len(_entry.plans) == 1
    others = [inputs(dev, B=5, T=13, seed=3),                      # another shape
              inputs(dev, seed=4, dtype=torch.float64)]            # another dtype
    t = inputs(dev, B=7, T=16, seed=5)                             # another row stride
    others.append({k: v[:, :13] for k, v in t.items()})
    for y in others:
        got = call(y, {})
        want = python_path(lambda: call(y, {}))
        assert_same(got, want)
    # the mask as f32 where the plan saw bool, an optional input the plan did not have
    y = inputs(dev, seed=6)
    y["mask"] = y["mask"].float()
    assert_same(call(y, {}), python_path(lambda: call(y, {})))
    y = inputs(dev, seed=7)
    assert_same(call(y, dict(ref_logp=y["ref"])), python_path(lambda: call(y, dict(ref_logp=y["ref"]))))


def test_numpy_and_released_contexts(entry, python_path):
    _entry.forget()
    x = inputs("cpu")
    call(x, {})
    n = {k: v.numpy() for k, v in x.items()}
    got = rlk.policy_loss(n["logp"], n["old"], n["adv"], n["mask"])  # numpy: the Python path
    want = call(x, {})
    np.testing.assert_array_equal(got.grad_logp, want.grad_logp.numpy())
    # a released context takes its plans with it: the next call makes a new context and plan
    rlk.release_contexts()
    assert len(_entry.plans) == 0
    y = inputs("cpu", seed=8)
    assert_same(call(y, {}), python_path(lambda: call(y, {})))
    assert len(_entry.plans) == 1
    # so does a shared context closed by hand
    rlk.context("host").close()
    assert len(_entry.plans) == 0
    rlk.release_contexts()
    assert_same(call(y, {}), python_path(lambda: call(y, {})))


def test_autograd_through_the_plan(entry, python_path, plans_only):
    from rlk import autograd as A
    _entry.forget()
    x = inputs("cpu")

    def step(y):
        logp = y["logp"].clone().requires_grad_(True)
        loss, metrics = A.policy_loss(logp, y["old"], y["adv"], y["mask"], clip_high=0.28)
        loss.backward()
        return loss.detach(), metrics, logp.grad

    step(x)
    y = inputs("cpu", seed=9)
    got = plans_only(lambda: step(y))
    want = python_path(lambda: step(y))
    assert_same(got, want)


def test_status_says_what_is_in_use(entry):
    state, path = _entry.status()
    assert state == "in use" and os.path.exists(path)


VALUE_CASES = [
    ("defaults", lambda x: {}),
    ("clip and token normalizer number", lambda x: dict(clip=0.2, token_normalizer=float(x["mask"].sum()))),
    ("token normalizer tensor", lambda x: dict(token_normalizer=x["mask"].sum().double())),
    ("scalar loss, apart, no metrics", lambda x: dict(scalar_loss=True, apart=True, metrics=False)),
]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("name,kw", VALUE_CASES, ids=[c[0] for c in VALUE_CASES])
def test_value_loss_plan_equals_python_path(entry, python_path, plans_only, dev, name, kw):
    _entry.forget()

    def vcall(y):
        return rlk.value_loss(y["adv"], y["old"], y["ref"], y["mask"], **kw(y))

    vcall(inputs(dev))
    assert len(_entry.plans) == 1, "no plan kept for %s" % name
    for seed in (1, 2):
        y = inputs(dev, seed=seed)
        got = plans_only(lambda: vcall(y))
        assert_same(got, python_path(lambda: vcall(y)))


LOGPROB_CASES = [
    ("defaults", {}, {}),
    ("entropy, temperature", dict(entropy=True, temperature=0.7), dict(temperature=0.7)),
    ("no lse", dict(lse=False), None),
]


def logits_inputs(dev, N=9, V=37, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(N, V, generator=g) * 3).to(dtype)
    labels = torch.randint(0, V, (N,), generator=g)
    labels[2] = -100  # an ignored row
    return logits.to(dev), labels.to(dev), torch.randn(N, generator=g).to(dev)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("name,fkw,bkw", LOGPROB_CASES, ids=[c[0] for c in LOGPROB_CASES])
def test_logprob_plans_equal_python_path(entry, python_path, plans_only, dev, name, fkw, bkw):
    _entry.forget()

    def run(seed, dtype=torch.float32):
        logits, labels, g = logits_inputs(dev, seed=seed, dtype=dtype)
        out = rlk.logprob(logits, labels, **fkw)
        if bkw is None:
            return out
        grad = rlk.logprob_backward(logits, labels, out.lse, grad_logp=g, **bkw)
        return tuple(out) + (grad,)

    run(0)
    kept = len(_entry.plans)
    assert kept == (1 if bkw is None else 2)
    for seed in (1, 2):
        got = plans_only(lambda: run(seed))
        assert_same(got, python_path(lambda: run(seed)))
    got = run(3, torch.bfloat16)  # another dtype: the Python path, a plan of its own
    assert_same(got, python_path(lambda: run(3, torch.bfloat16)))


def test_token_logprob_autograd_through_the_plans(entry, python_path, plans_only):
    from rlk import autograd as A
    _entry.forget()

    def step(seed):
        logits, labels, _ = logits_inputs("cpu", seed=seed)
        logits.requires_grad_(True)
        logp, ent = A.token_logprob(logits, labels, entropy=True)
        (logp.sum() + 0.1 * ent.sum()).backward()
        return logp.detach(), ent.detach(), logits.grad

    step(0)
    assert len(_entry.plans) == 2  # the forward's and the backward's
    got = plans_only(lambda: step(1))
    assert_same(got, python_path(lambda: step(1)))


ADV_CASES = [
    ("grpo", lambda x: dict(group_size=4)),
    ("rloo, broadcast", lambda x: dict(group_size=4, mode="rloo", mask=x["mask"], broadcast=True)),
    ("token rewards, uneven groups", lambda x: dict(
        scores=x["rewards"], mask=x["mask"], group_offsets=x["offsets"])),
]


def adv_inputs(dev, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = {"scores": torch.randn(12, generator=g), "rewards": torch.randn(12, 9, generator=g),
         "mask": torch.rand(12, 9, generator=g) > 0.3,
         "offsets": torch.tensor([0, 3, 8, 12], dtype=torch.int32)}
    return {k: v.to(dev) for k, v in x.items()}


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("name,kw", ADV_CASES, ids=[c[0] for c in ADV_CASES])
def test_group_advantage_plan_equals_python_path(entry, python_path, plans_only, dev, name, kw):
    def run(seed):
        x = adv_inputs(dev, seed)
        k = kw(x)
        return rlk.group_advantage(k.pop("scores", x["scores"]), **k)

    plan_serves(run, name, python_path, plans_only)


def plan_serves(run, name, python_path, plans_only):
    """run(seed) on fresh inputs: the first call keeps one plan, which serves the next two with
    the Python path's results bit for bit."""
    _entry.forget()

    def outs(seed):
        out = run(seed)
        return out if isinstance(out, tuple) else (out,)

    outs(0)
    assert len(_entry.plans) == 1, "no plan kept for %s" % name
    for seed in (1, 2):
        assert_same(plans_only(lambda: outs(seed)), python_path(lambda: outs(seed)))


# (name, the call on the inputs): the advantages and returns over time, with and without a mask
SCAN_CASES = [
    ("gae", lambda x: rlk.gae(x["r"], x["v"], x["mask"], gamma=0.99, lam=0.95)),
    ("gae advantages alone, zero", lambda x: rlk.gae(x["r"], x["v"], x["mask"], masked="zero",
                                                      compute_returns=False)),
    ("gae no mask, f64", lambda x: rlk.gae(x["r"].double(), x["v"].double())),
    ("discounted_returns", lambda x: rlk.discounted_returns(x["r"], x["mask"], gamma=0.9)),
    ("discounted_returns carry", lambda x: rlk.discounted_returns(x["r"], x["mask"],
                                                                  masked="carry")),
    ("reverse_cumsum", lambda x: rlk.reverse_cumsum(x["r"], x["mask"])),
    ("reverse_cumsum baseline", lambda x: rlk.reverse_cumsum(x["r"], x["mask"], baseline=x["b"])),
    ("masked_whiten", lambda x: rlk.masked_whiten(x["r"], x["mask"])),
    ("masked_whiten clamp, no mask", lambda x: rlk.masked_whiten(x["v"], eps_mode="clamp",
                                                                 shift_mean=False)),
]


def scan_inputs(dev, seed=0, resized=False):
    B, T = 6, 40 if resized else 37
    g = torch.Generator().manual_seed(seed)
    x = {"r": torch.randn(B, T, generator=g), "v": torch.randn(B, T, generator=g),
         "mask": torch.rand(B, T, generator=g) > 0.2, "b": torch.randn(B, generator=g)}
    return {k: v.to(dev) for k, v in x.items()}


# (name, the call on the inputs): the fused head's forward and backward, with and without their
# optional parts
HEAD_CASES = [
    ("linear_logprob", lambda x: tuple(rlk.linear_logprob(x["h"], x["w"], x["y"]))[:2]),
    ("linear_logprob entropy, temperature", lambda x: tuple(rlk.linear_logprob(
        x["h"], x["w"], x["y"], entropy=True, temperature=0.7, lse=False))[::2]),
    ("linear_logprob rows, threshold", lambda x: tuple(rlk.linear_logprob(
        x["h"], x["w"], x["y"][x["rows"]], rows=x["rows"], threshold=x["thr"][x["rows"]],
        entropy=True))),
    ("linear_logprob_backward", lambda x: rlk.linear_logprob_backward(
        x["h"], x["w"], x["y"], x["lse"], x["g"])),
    ("linear_logprob_backward entropy, weight alone, same dtype", lambda x: (
        rlk.linear_logprob_backward(x["h"], x["w"], x["y"], x["lse"], x["g"], x["g"].flip(0),
                                    x["ent"], want_hidden=False, grad_dtype="same")[1],)),
]


def head_inputs(dev, seed=0, resized=False):
    N, H, V = 9 if resized else 13, 40, 77
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=g).to(torch.bfloat16)
    w = (torch.randn(V, H, generator=g) / 4).to(torch.bfloat16)
    x = {"h": h, "w": w, "y": torch.randint(0, V, (N,), generator=g),
         "rows": torch.tensor([0, 2, 3, 7, N - 1]), "thr": torch.randn(N, generator=g)}
    x["y"][1] = -100  # an ignored row
    x["g"] = torch.randn(N, generator=g)
    x = {k: v.to(dev) for k, v in x.items()}
    with torch.no_grad():  # the forward's statistics, from an fp64 head (any values do)
        z = x["h"].double() @ x["w"].double().T
        x["lse"] = torch.logsumexp(z, 1).float()
        p = torch.softmax(z, 1)
        x["ent"] = (x["lse"].double() - (p * z).sum(1)).float()
    return x


# (name, the call on the inputs): the draws, their seed and offset numbers written per call (a
# seed past 2^63 and a negative offset: the numbers' 64-bit patterns), or per-row arrays
DRAW_CASES = [
    ("sample top-k top-p", lambda x: tuple(rlk.sample(
        x["logits"], temperature=0.9, top_k=20, top_p=0.9, seed=2**64 - 5, offset=x["step"]))),
    ("sample per-row arrays, min-p, i32, filtered, threshold", lambda x: tuple(rlk.sample(
        x["logits"], temperature=x["temps"], top_p=x["top_ps"], min_p=0.05, seed=x["seeds"],
        offset=-x["step"], token_dtype="i32", logp_filtered=True, threshold=True))),
    ("sample greedy, no log-prob", lambda x: tuple(rlk.sample(x["logits"], temperature=0.0, logp=False))),
    ("linear_sample", lambda x: tuple(rlk.linear_sample(
        x["h"], x["w"], temperature=0.8, top_k=10, seed=7, offset=x["step"], lse=True, entropy=True,
        threshold=True))),
    ("linear_sample per-row seeds and offsets, i32", lambda x: tuple(rlk.linear_sample(
        x["h"], x["w"], top_p=0.8, seed=x["seeds"], offset=x["seeds"].flip(0), token_dtype="i32"))),
]


def draw_inputs(dev, seed=0, resized=False):
    x = head_inputs(dev, seed, resized)
    N = x["h"].shape[0]
    g = torch.Generator().manual_seed(100 + seed)
    y = {"logits": torch.randn(N, 50, generator=g) * 2, "temps": torch.rand(N, generator=g) + 0.5,
         "top_ps": torch.rand(N, generator=g) * 0.5 + 0.5,
         "seeds": torch.randint(-2**62, 2**62, (N,), generator=g)}
    x.update({k: v.to(dev) for k, v in y.items()})
    x["step"] = 1000 * seed + 3  # another offset each call
    return x


# (name, the inputs' builder, the call on them): every op a plan serves above
PLAN_CASES = ([(n, scan_inputs, f) for n, f in SCAN_CASES] + [(n, head_inputs, f) for n, f in HEAD_CASES]
              + [(n, draw_inputs, f) for n, f in DRAW_CASES])


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("name,inputs,fn", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_plans_equal_python_path(entry, python_path, plans_only, dev, name, inputs, fn):
    plan_serves(lambda seed: fn(inputs(dev, seed)), name, python_path, plans_only)
    # another shape is not the plan's: the Python path runs it (and keeps a plan of its own)
    with pytest.raises(_PythonPathRan):
        plans_only(lambda: fn(inputs(dev, 3, resized=True)))


_FILL_C = r"""
#include <stddef.h>
struct args { float *out; float *loss; unsigned char *ws; double scale; const float *in; };
/* out = in * scale; loss = the workspace's distance in bytes from out; status 7 when scale < 0 */
int fill(void *ctx, const void *a_, void *stream) {
  const struct args *a = a_;
  (void)ctx; (void)stream;
  if (a->scale < 0) return 7;
  for (int i = 0; i < 4; i++) a->out[i] = a->in[i] * (float)a->scale;
  *a->loss = (float)(a->ws - (unsigned char *)a->out);
  return 0;
}
"""


@pytest.fixture(scope="module")
def fill_fn(tmp_path_factory):
    """A C function of an rlk call's signature over a small struct of its own (_FILL_C)."""
    import ctypes
    import subprocess
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler for the stand-in call")
    d = tmp_path_factory.mktemp("fill")
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-x", "c", "-", "-o", str(d / "fill.so")],
                   input=_FILL_C, text=True, check=True)
    lib = ctypes.CDLL(str(d / "fill.so"))
    return lib, ctypes.cast(lib.fill, ctypes.c_void_p).value


@pytest.mark.parametrize("buffer", [True, False], ids=["one buffer", "apart"])
def test_plan_lays_outputs_and_workspace_out(entry, fill_fn, buffer):
    """The C++ plan alone: outputs in one buffer (the loss a 0-d view at element 4, the workspace
    at byte 32) or each its own, pointers written where the struct says, the per-call number,
    a status, and tensors that do not fit."""
    import struct
    args = struct.pack("=QQQdQ", 0, 0, 0, 0.0, 0)
    outs = [(0 if buffer else -1, (4,), (1,), [0], torch.float32), (4 if buffer else -1, (), (), [8], torch.float32)]
    plan = entry.Plan(args, fill_fn[1], 0, 0, -1, [(32, torch.float32, (4,), (1,))], outs,
                      12 if buffer else 0, torch.float32, 16, 32 if buffer else 0, 16, [(24, 0)])
    x = torch.randn(4, dtype=torch.float32)
    out, loss = plan((x,), [2.5], 0)
    assert torch.equal(out, x * 2.5) and out.shape == (4,) and loss.shape == ()
    if buffer:
        assert loss.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
        assert loss.storage_offset() == 4 and float(loss) == 32.0
    else:
        assert loss.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()
    y = torch.randn(4, dtype=torch.float32)
    out2, _ = plan((y,), [-0.5 * -2], 0)
    assert torch.equal(out2, y) and out2.data_ptr() != out.data_ptr()
    assert plan((y,), [-1.0], 0) == 7  # the call's status, the outputs dropped
    assert plan((y.double(),), [1.0], 0) is None  # another dtype
    assert plan((torch.randn(5),), [1.0], 0) is None  # another size
    assert plan((torch.randn(8)[::2],), [1.0], 0) is None  # another stride
    assert plan((y.numpy(),), [1.0], 0) is None  # not a torch tensor
    assert plan((y, y), [1.0], 0) is None and plan((y,), [], 0) is None  # other counts
    with pytest.raises(Exception):  # a field outside the struct
        entry.Plan(args, fill_fn[1], 0, 0, -1, [(36, torch.float32, (4,), (1,))], outs, 0,
                   torch.float32, 0, 0, -1, [])
    assert plan((y,), ["2"], 0) is None  # not a number: the Python path's to name


def test_a_numpy_scalar_normalizer_is_written_per_call(entry, python_path, plans_only):
    """A normalizer given as another kind of number (a numpy scalar) is a number each call
    writes, not a value a plan keeps."""
    _entry.forget()
    x = inputs("cpu")
    call(x, dict(token_normalizer=np.float64(40.0)))
    y = inputs("cpu", seed=1)
    got = plans_only(lambda: call(y, dict(token_normalizer=np.float64(25.0))))
    assert_same(got, python_path(lambda: call(y, dict(token_normalizer=np.float64(25.0)))))
    assert_same(got, python_path(lambda: call(y, dict(token_normalizer=25.0))))


def test_plan_refuses_a_layout_outside_its_buffer(entry, fill_fn):
    import struct
    args = struct.pack("=QQQdQ", 0, 0, 0, 0.0, 0)
    ins = [(32, torch.float32, (4,), (1,))]
    f = torch.float32
    for outs, ws in (([(0, (4,), (1,), [0], f), (12, (), (), [8], f)], (0, 0)),    # the loss past the end
                     ([(0, (4,), (4,), [0], f), (4, (), (), [8], f)], (0, 0)),     # a stride past the end
                     ([(0, (4,), (1,), [0], f), (4, (), (), [8], f)], (16, 40))):  # the workspace past it
        with pytest.raises(Exception, match="outside"):
            entry.Plan(args, fill_fn[1], 0, 0, -1, ins, outs, 12, torch.float32, ws[0], ws[1], 16, [(24, 0)])


_TYPED_C = r"""
#include <stdint.h>
struct args { int64_t *tok; float *val; uint64_t u; float f; int32_t i; };
/* tok[0] = the 64-bit number's bits, tok[1] = the 32-bit one; val[0] = the f32 number */
int typed(void *ctx, const void *a_, void *stream) {
  const struct args *a = a_;
  (void)ctx; (void)stream;
  a->tok[0] = (int64_t)a->u;
  a->tok[1] = a->i;
  a->val[0] = a->f;
  return 0;
}
"""


def test_plan_writes_numbers_as_their_c_types(entry, tmp_path):
    """Numbers written per call as the field's C type (a 64-bit integer's bits, an i32, an f32
    rounded as ctypes rounds), outputs of their own dtypes beside one another."""
    import ctypes
    import struct
    import subprocess
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler for the stand-in call")
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-x", "c", "-", "-o", str(tmp_path / "typed.so")],
                   input=_TYPED_C, text=True, check=True)
    lib = ctypes.CDLL(str(tmp_path / "typed.so"))
    fn = ctypes.cast(lib.typed, ctypes.c_void_p).value
    args = struct.pack("=QQQfi", 0, 0, 0, 0.0, 0)
    outs = [(-1, (2,), (1,), [0], torch.int64), (-1, (1,), (1,), [8], torch.float32)]
    plan = entry.Plan(args, fn, 0, 0, -1, [], outs, 0, torch.float32, 0, 0, -1, [(16, 3), (24, 1), (28, 2)])
    for u, f, i in ((2**64 - 5, 0.1, -3), (-1, 1e-30, 2**31 + 7), (12345, 3, 0)):
        tok, val = plan((), [u, f, i], 0)
        assert tok.dtype == torch.int64 and val.dtype == torch.float32
        want_u = ctypes.c_int64(ctypes.c_uint64(u).value).value
        assert tok.tolist() == [want_u, ctypes.c_int32(i).value]
        assert val.item() == ctypes.c_float(f).value
    assert plan((), [1.5, 0.1, 0], 0) is None  # a float where the C field is an integer
    with pytest.raises(Exception):  # a number's bytes past the struct's end
        entry.Plan(args, fn, 0, 0, -1, [], outs, 0, torch.float32, 0, 0, -1, [(28, 3)])
    with pytest.raises(Exception):  # an output in the f32 buffer that is not f32
        entry.Plan(args, fn, 0, 0, -1, [], [(0, (2,), (1,), [0], torch.int64)], 4, torch.float32, 0, 0, -1, [])


# ---- building and loading the module: what the folder must be, who renames the output ----------

def _fresh_state(monkeypatch, root):
    monkeypatch.setenv("RLK_TORCH_ENTRY_DIR", str(root))
    for k, v in (("module", None), ("started", False), ("error", None), ("thread", None)):
        monkeypatch.setitem(_entry._state, k, v)


def test_a_folder_others_may_write_is_not_used(monkeypatch, tmp_path):
    """Code in a folder someone else could write is not loaded, nor built there: a shared or
    world-writable RLK_TORCH_ENTRY_DIR leaves the entry off, saying why."""
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    _fresh_state(monkeypatch, root)
    path = str(root / "f" / "m.so")
    _entry._build(path, ["sh", "-c", 'cp /bin/true "$0"', "OUT"])
    assert "writable by group or others" in (_entry._state["error"] or ""), _entry._state["error"]
    assert not os.path.exists(path)
    os.makedirs(os.path.dirname(path))
    shutil.copyfile("/bin/true", path)
    with pytest.raises(RuntimeError, match="writable by group or others"):
        _entry._load(path)


def test_the_compile_renames_its_own_output(monkeypatch, tmp_path):
    """The compile moves its output into place itself, under the folder's lock: a process that
    exits mid-build leaves the module for the next one, and no partial file."""
    import subprocess
    import sys
    import textwrap
    import time
    root = tmp_path / "entry"
    path = root / "f" / "m.so"
    script = textwrap.dedent("""
        import os, sys, threading
        sys.path.insert(0, %r)
        os.environ["RLK_TORCH_ENTRY_DIR"] = %r
        from rlk import _entry
        threading.Thread(target=_entry._build, daemon=True,
                         args=(%r, ["sh", "-c", 'sleep 1; cp /bin/true "$0"', "OUT"])).start()
        import time; time.sleep(0.3)  # the compile has started; the process exits before it ends
    """ % (os.path.dirname(os.path.dirname(_entry.__file__)), str(root), str(path)))
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert not path.exists()
    for _ in range(100):
        if path.exists():
            break
        time.sleep(0.05)
    assert path.exists(), sorted(os.listdir(path.parent))
    assert not [f for f in os.listdir(path.parent) if f.endswith(".so.tmp")]
    assert (os.stat(root).st_mode & 0o777) == 0o700 and (os.stat(path.parent).st_mode & 0o777) == 0o700


def test_folders_an_earlier_version_left_open_are_tightened(monkeypatch, tmp_path):
    """A hash folder of this user's left group-writable (made under a umask of 002) is made 0700
    and used; a chosen RLK_TORCH_ENTRY_DIR itself is never changed."""
    root = tmp_path / "entry"
    folder = root / "f"
    folder.mkdir(parents=True)
    os.chmod(folder, 0o775)
    _fresh_state(monkeypatch, root)
    path = folder / "m.so"
    shutil.copyfile("/bin/true", path)
    os.chmod(path, 0o755)
    with pytest.raises(Exception) as e:  # loads past the trust check: /bin/true is no module
        _entry._load(str(path))
    assert not isinstance(e.value, _entry._Untrusted), e.value
    assert (os.stat(folder).st_mode & 0o777) == 0o700
    os.chmod(root, 0o775)
    with pytest.raises(_entry._Untrusted, match="writable by group or others"):
        _entry._load(str(path))
    assert (os.stat(root).st_mode & 0o777) == 0o775


@pytest.mark.parametrize("dev", DEVICES)
def test_a_draw_number_wider_than_64_bits_is_refused_past_a_plan(entry, dev):
    """A seed or offset a plan writes per call: one outside [-2^63, 2^64) is not masked to its
    low bits (2^64 would draw as seed 0) but takes the Python path, which refuses it."""
    _entry.forget()
    x = draw_inputs(dev)
    rlk.sample(x["logits"], top_k=20, seed=5, offset=3)
    assert len(_entry.plans) == 1
    for bad in (dict(seed=2 ** 64), dict(offset=-2 ** 63 - 1), dict(seed=2 ** 70)):
        with pytest.raises(rlk.InvalidArgument, match="outside 64 bits"):
            rlk.sample(x["logits"], top_k=20, **{"seed": 5, "offset": 3, **bad})
    # the widest taken: 2^64 - 1 is written as the bits of -1
    a = rlk.sample(x["logits"], top_k=20, seed=2 ** 64 - 1, offset=3)
    b = rlk.sample(x["logits"], top_k=20, seed=-1, offset=3)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logp, b.logp)
