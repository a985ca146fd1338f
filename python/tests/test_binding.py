"""The binding's hot path (rlk._tensor): what it caches must not skip a check or leak from one
call into the next. Every check is made after a successful call, so the caches are warm."""
import ctypes
import threading

import numpy as np
import pytest

import refs
import rlk
from rlk import _lib
from rlk import _tensor as R
from rlk import _types as T
from rlk.ops import group_advantage as GA
from conftest import HAVE_TORCH, Place

if HAVE_TORCH:
    import torch

need_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
NUMPY = Place("numpy")


def grpo(s, G):
    return refs.group_advantage(np.asarray(s, np.float64), refs.fixed_offsets(len(s), G), "grpo")


def zero_d(place, value=1.0):
    """A 0-d f32 array (place.to makes at least 1-D ones)."""
    if place.torch:
        return torch.tensor(value, dtype=torch.float32, device="cuda" if place.cuda else "cpu")
    return np.array(value, np.float32)


def warm(place):
    """One good call, so the type, place, dtype and context caches are filled."""
    s = np.arange(8, dtype=np.float32)
    adv = rlk.group_advantage(place.to(s), 4)
    assert np.allclose(place.back(adv), grpo(s, 4), atol=1e-5)


# ---- the checks, after the caches are warm ---------------------------------------------------

def test_wrong_dtype_names_the_argument(place):
    warm(place)
    with pytest.raises(rlk.InvalidArgument, match="group_advantage: scores: dtype i64 is not"):
        rlk.group_advantage(place.to(np.ones(8, np.int64)), 4)
    with pytest.raises(rlk.InvalidArgument, match="group_advantage: advantages: dtype f64"):
        rlk.group_advantage(place.to(np.ones(8, np.float32)), 4,
                            advantages=place.to(np.zeros(8)))
    warm(place)


def test_not_an_array_names_the_argument(place):
    warm(place)
    s = place.to(np.ones(8, np.float32))
    for bad in ([1.0] * 8, 3.0, "scores"):
        with pytest.raises(rlk.InvalidArgument, match="group_advantage: mask: expected a "
                           "torch.Tensor or a numpy.ndarray, got %s" % type(bad).__name__):
            rlk.group_advantage(s, 4, mask=bad)
    with pytest.raises(rlk.InvalidArgument, match="logprob: labels: expected a torch.Tensor"):
        rlk.logprob(place.to(np.zeros((2, 4), np.float32)), [0, 1])


def test_read_only_output_names_the_argument(host):
    warm(NUMPY)
    out = np.zeros(8, np.float32)
    out.flags.writeable = False
    with pytest.raises(rlk.InvalidArgument, match="group_advantage: advantages: is an output "
                       "but the array is read-only"):
        rlk.group_advantage(np.ones(8, np.float32), 4, advantages=out)
    # a read-only input is fine
    s = np.arange(8, dtype=np.float32)
    s.flags.writeable = False
    assert np.allclose(rlk.group_advantage(s, 4), grpo(s, 4), atol=1e-5)


def test_required_argument_and_dimensions(place):
    warm(place)
    with pytest.raises(rlk.InvalidArgument, match="policy_loss: old_logp: is required"):
        rlk.policy_loss(place.to(np.zeros((2, 3), np.float32)), None,
                        place.to(np.zeros((2, 3), np.float32)))
    with pytest.raises(rlk.InvalidArgument, match="scores: has 5 dimensions, at most 4"):
        rlk.group_advantage(place.to(np.zeros((1, 1, 1, 1, 8), np.float32)), 4)
    # a 0-d array gets its descriptor (size 0 where a dimension is missing) and the library's
    # own message, not a Python IndexError
    with pytest.raises(rlk.InvalidArgument, match="group_advantage: scores"):
        rlk.group_advantage(zero_d(place), 1)
    with pytest.raises(rlk.InvalidArgument):
        rlk.logprob(place.to(np.zeros(4, np.float32)), place.to(np.zeros(4, np.int64)))


def test_numpy_strides_not_a_multiple_of_the_item_size(host):
    warm(NUMPY)
    raw = np.zeros(64, np.uint8)
    odd = np.ndarray((8,), np.float32, raw.data, offset=2, strides=(5,))
    with pytest.raises(rlk.InvalidArgument, match="scores: strides \\(5,\\) are not a multiple "
                       "of the element size 4"):
        rlk.group_advantage(odd, 4)


@need_torch
def test_torch_device_dtype_and_grad_checks(host):
    warm_torch = torch.arange(8, dtype=torch.float32)
    rlk.group_advantage(warm_torch, 4)
    with pytest.raises(rlk.InvalidArgument, match="group_advantage: scores: tensors on meta are "
                       "not supported"):
        rlk.group_advantage(torch.empty(8, device="meta"), 4)
    with pytest.raises(rlk.InvalidArgument, match="group_advantage: mask: tensors on meta"):
        rlk.group_advantage(torch.ones(8, 3), 4, mask=torch.ones(8, 3, device="meta"))
    with pytest.raises(rlk.InvalidArgument, match=r"mask: dtype torch.uint8 has no rlk "
                       r"equivalent \(use .bool"):
        rlk.group_advantage(torch.ones(8, 3), 4, mask=torch.ones(8, 3, dtype=torch.uint8))
    with pytest.raises(rlk.InvalidArgument, match="scores: dtype torch.complex64 has no rlk"):
        rlk.group_advantage(torch.ones(8, dtype=torch.complex64), 4)
    with pytest.raises(rlk.InvalidArgument, match="advantages: is an output but requires grad"):
        rlk.group_advantage(warm_torch, 4, advantages=torch.zeros(8, requires_grad=True))
    with pytest.raises(rlk.InvalidArgument, match="scores: only strided"):
        rlk.group_advantage(torch.ones(8).to_sparse(), 4)
    # a tensor that requires grad is a fine input, and a subclass (Parameter) takes the same path
    p = torch.nn.Parameter(torch.arange(8, dtype=torch.float32))
    assert np.allclose(rlk.group_advantage(p, 4).numpy(), grpo(np.arange(8), 4), atol=1e-5)


def test_arguments_in_other_memory_are_refused(host):
    # what torch CUDA tensors beside host ones reach (test_group_advantage runs it on a GPU);
    # here with the Place a CUDA tensor on device 1 gets, over a warm numpy call
    warm(NUMPY)
    b = R.Binder(GA.OP)
    b.set("scores", np.ones(8, np.float32))
    gpu = R.Place(T.Backend.CUDA, 1, "torch", "cuda:1")
    with pytest.raises(rlk.InvalidArgument, match="group_advantage: mask: is in cuda:1, the "
                       "other arguments in host memory \\(numpy\\)"):
        b._join("mask", gpu)
    b = R.Binder(GA.OP)
    b._join("scores", gpu)
    b._join("advantages", R.Place(T.Backend.CUDA, 1, "torch", "cuda:1"))  # same device
    with pytest.raises(rlk.InvalidArgument, match="advantages: is in cuda:0, the other "
                       "arguments in cuda:1"):
        b._join("advantages", R.Place(T.Backend.CUDA, 0, "torch", "cuda:0"))


@need_torch
def test_numpy_and_torch_cpu_share_host_memory(host):
    # both are host memory: allowed together, outputs made in the first argument's framework
    s = np.arange(8, dtype=np.float32)
    rows = s.reshape(8, 1)
    adv = rlk.group_advantage(torch.from_numpy(rows), 4, mask=np.ones((8, 1), bool))
    assert isinstance(adv, torch.Tensor)
    assert np.allclose(adv.numpy(), grpo(s, 4), atol=1e-5)
    adv = rlk.group_advantage(s, 4, advantages=torch.zeros(8))
    assert isinstance(adv, torch.Tensor)
    adv = rlk.group_advantage(rows, 4, mask=torch.ones(8, 1, dtype=torch.bool))
    assert isinstance(adv, np.ndarray) and np.allclose(adv, grpo(s, 4), atol=1e-5)


def test_enum_arguments_after_caching():
    for v in ("rloo", "RLOO", "Rloo", " rloo ", rlk.AdvantageMode.RLOO, 2):
        assert T.enum_value(rlk.AdvantageMode, v, "mode") == 2
    assert T.enum_value(rlk.AdvantageMode, "mean-only", "mode") == 1
    assert T.enum_value(rlk.AdvantageMode, "mean_only", "mode") == 1
    # equal to an int key, but not an enum argument
    for bad in (True, False, 2.0, "ppo", 9, None):
        with pytest.raises(rlk.InvalidArgument, match="mode: .* is not one of grpo"):
            T.enum_value(rlk.AdvantageMode, bad, "mode")
    with pytest.raises(rlk.InvalidArgument, match="mode: True is not one of"):
        rlk.group_advantage(np.ones(8, np.float32), 4, mode=True)


# ---- the descriptors ---------------------------------------------------------------------------

def descriptor(t):
    return (t.data or 0, t.dtype, t.ndim, tuple(t.shape), tuple(t.strides))


@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 4), (2, 1, 3, 2)], ids=str)
def test_packed_descriptor_is_the_mirrors(place, shape):
    # every field of the rlk_tensor a Binder packs, over an args struct full of garbage: the
    # unused dimensions must read 0 (the library checks shape[i] past ndim)
    warm(place)
    a = place.to(np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)) if shape \
        else zero_d(place, 3.0)
    b = R.Binder(GA.OP)
    ctypes.memset(ctypes.addressof(b.args), 0xA5, ctypes.sizeof(b.args))
    assert b.set("scores", a) == T.DType.F32
    want_ptr = a.data_ptr() if place.torch else a.ctypes.data
    want_strides = tuple(a.stride()) if place.torch else tuple(s // 4 for s in a.strides)
    pad = (0,) * (T.MAX_DIMS - len(shape))
    assert descriptor(b.args.scores) == (want_ptr, int(T.DType.F32), len(shape),
                                         tuple(shape) + pad, want_strides + pad)


def test_packed_descriptor_strided_and_negative(host):
    wide = np.arange(60, dtype=np.float64).reshape(6, 10)
    for a in (wide[:, 2:7], wide[::2, ::3], wide[::-1], wide.T, wide[:, 4]):
        b = R.Binder(GA.OP)
        b.set("scores", a)
        assert descriptor(b.args.scores) == (
            a.ctypes.data, int(T.DType.F64), a.ndim,
            a.shape + (0,) * (4 - a.ndim), tuple(s // 8 for s in a.strides) + (0,) * (4 - a.ndim))


def test_layouts_kept_skip_no_check(place):
    # a descriptor's shape and strides are packed once per layout: a layout seen before must
    # still have its dtype checked and its empty batch noticed
    warm(place)
    f32 = place.to(np.zeros((3, 4), np.float32))
    for _ in range(2):
        b = R.Binder(GA.OP)
        assert b.set("scores", f32, (T.DType.F32,)) == T.DType.F32
        assert not b.no_rows
        assert descriptor(b.args.scores)[2:] == (2, (3, 4, 0, 0), (4, 1, 0, 0))
    i64 = place.to(np.zeros((3, 4), np.int64))  # the same layout, another dtype
    with pytest.raises(rlk.InvalidArgument, match="s: dtype i64 is not supported"):
        R.Binder(GA.OP).set("s", i64, (T.DType.F32,))
    empty = place.to(np.zeros((0, 4), np.float32))
    for optional, want in ((False, True), (True, False), (False, True)):
        b = R.Binder(GA.OP)
        b.set("scores", empty, optional=optional)
        assert b.no_rows is want


def test_bind_checks_what_set_checks(place):
    # Binder.bind packs the inputs after the first in a loop of its own: it must write what set
    # writes, and refuse what set refuses, with set's messages
    from rlk.ops import losses as L
    warm(place)
    x = place.to(np.arange(12, dtype=np.float32).reshape(3, 4))
    mask = place.to(np.ones((3, 4), bool))
    for _ in range(2):  # the second time, every layout is a kept one
        one = R.Binder(L.VALUE_OP)
        for name, arr in (("values", x), ("old_values", x), ("returns", x), ("mask", mask)):
            one.set(name, arr, None if name == "mask" else L._F, optional=name == "mask")
        both = R.Binder(L.VALUE_OP)
        assert both.bind(L._VL_INPUTS, (x, x, x, mask, None)) == T.DType.F32
        assert bytes(both.args) == bytes(one.args) and both.place is one.place
        assert not both.no_rows
    i64 = place.to(np.zeros((3, 4), np.int64))  # a kept layout, a dtype not accepted
    with pytest.raises(rlk.InvalidArgument, match="value_loss: old_values: dtype i64 is not "
                       "supported"):
        R.Binder(L.VALUE_OP).bind(L._VL_INPUTS, (x, i64, x, None, None))
    with pytest.raises(rlk.InvalidArgument, match="value_loss: returns: is required"):
        R.Binder(L.VALUE_OP).bind(L._VL_INPUTS, (x, x, None, None, None))
    with pytest.raises(rlk.InvalidArgument, match="value_loss: seq_offsets: dtype f32"):
        R.Binder(L.VALUE_OP).bind(L._VL_INPUTS, (x, x, x, None, x))
    empty = place.to(np.zeros((0, 4), np.float32))
    b = R.Binder(L.VALUE_OP)
    b.bind(L._VL_INPUTS, (x, x, empty, None, None))  # a required input without rows
    assert b.no_rows
    b = R.Binder(L.VALUE_OP)
    b.bind(L._VL_INPUTS, (x, x, x, place.to(np.zeros((0, 4), bool)), None))  # an optional one
    assert not b.no_rows
    if place.torch:
        with pytest.raises(rlk.InvalidArgument, match="value_loss: returns: tensors on meta"):
            R.Binder(L.VALUE_OP).bind(L._VL_INPUTS, (x, x, torch.zeros(3, 4, device="meta"),
                                                     None, None))
    if place.cuda:  # (host numpy arrays and torch CPU tensors may be mixed)
        with pytest.raises(rlk.InvalidArgument, match="value_loss: old_values: is in host "
                           "memory \\(numpy\\), the other arguments in "):
            R.Binder(L.VALUE_OP).bind(L._VL_INPUTS, (x, np.zeros((3, 4), np.float32), x,
                                                     None, None))


def test_absent_optional_leaves_the_default(host):
    b = R.Binder(GA.OP)
    assert b.set("mask", None, optional=True) is None
    assert descriptor(b.args.mask) == (0, 0, 0, (0,) * 4, (0,) * 4)


# ---- the args struct: one per call, from the library's defaults ---------------------------------

def test_args_start_from_the_library_defaults_every_call(host):
    mine = GA.GroupAdvantageArgs()
    _lib.library().rlk_group_advantage_args_init(ctypes.byref(mine))
    a = GA.OP.new_args()
    a.mode, a.eps = 2, 0.5
    assert bytes(GA.OP.new_args()) == bytes(mine)  # a call's changes stay in its own struct
    assert GA.OP.new_args() is not GA.OP.new_args()


def test_calls_with_other_shapes_and_options_in_turn(place, rng):
    # what one call sets (a shape, a mask, a mode, an output) must not reach the next
    for Bn, G, Tn, mode, with_mask in [(64, 8, 5, "grpo", True), (12, 4, 9, "rloo", False),
                                       (64, 8, 3, "mean-only", True), (6, 3, 2, "grpo", False),
                                       (64, 16, 1, "grpo", True)]:
        rewards = rng.standard_normal((Bn, Tn)).astype(np.float32)
        mask = rng.random((Bn, Tn)) < 0.6 if with_mask else None
        kw = {"mask": place.to(mask)} if with_mask else {}
        adv, tok = rlk.group_advantage(place.to(rewards), G, mode=mode, broadcast=True, **kw)
        want = refs.group_advantage(rewards, refs.fixed_offsets(Bn, G), mode, mask=mask)
        assert np.allclose(place.back(adv), want, atol=1e-4), (Bn, G, Tn, mode, with_mask)
        tok = place.back(tok)
        assert tok.shape == (Bn, Tn)
        assert np.allclose(tok, want[:, None] * (mask if with_mask else 1), atol=1e-4)


def test_policy_loss_optional_inputs_do_not_linger(place, rng):
    if not rlk.OPS["policy_loss"].available():
        pytest.skip("the loaded librlk has no rlk_policy_loss")
    lp = (rng.standard_normal((5, 11)) * 0.5 - 2.0).astype(np.float32)
    old = (lp + rng.standard_normal(lp.shape) * 0.3).astype(np.float32)
    ref = (lp + rng.standard_normal(lp.shape) * 0.3).astype(np.float32)
    adv = rng.standard_normal(lp.shape).astype(np.float32)
    base = rlk.policy_loss(place.to(lp), place.to(old), place.to(adv))
    with_kl = rlk.policy_loss(place.to(lp), place.to(old), place.to(adv), ref_logp=place.to(ref),
                              kl_coef=0.5)
    again = rlk.policy_loss(place.to(lp), place.to(old), place.to(adv))
    want = refs.policy_loss(lp, old, adv, None)[0]
    assert abs(float(place.back(base.loss)[0]) - want) <= 1e-5 * max(1.0, abs(want))
    assert float(place.back(with_kl.loss)[0]) != float(place.back(base.loss)[0])
    assert float(place.back(again.loss)[0]) == float(place.back(base.loss)[0])


def test_threads_calling_at_once(host):
    errors = []

    def worker(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(40):
                G = int(r.choice([2, 4, 8]))
                s = r.standard_normal(G * int(r.integers(1, 20))).astype(np.float32)
                got = rlk.group_advantage(s, G)
                if not np.allclose(got, grpo(s, G), atol=1e-4):
                    errors.append("seed %d: wrong advantages for B=%d" % (seed, len(s)))
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_struct_size_is_checked_once_per_op(host, monkeypatch):
    calls = []
    real = _lib.check_abi
    monkeypatch.setattr(_lib, "check_abi", lambda cls: (calls.append(cls), real(cls)))
    op = R.Op("group_advantage", GA.GroupAdvantageArgs)
    for _ in range(3):
        op.new_args()
    assert calls == [GA.GroupAdvantageArgs]


def test_integer_settings_the_fields_cannot_hold_are_refused(host):
    """An integer setting goes into its C field only where the field's type holds it: ctypes
    would keep the low bits, and the library would run another setting (an ignore_index of
    2^64 - 100 as -100, a top_k of 2^32 + 3 as 3, a group of 2^64 + 2 as 2)."""
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((4, 9)).astype(np.float32)
    labels = np.array([0, 3, -100, 8], np.int64)
    h = rng.standard_normal((4, 8)).astype(np.float16)
    w = rng.standard_normal((9, 8)).astype(np.float16)
    calls = [
        ("ignore_index", lambda v: rlk.logprob(logits, labels, ignore_index=v), 2 ** 64 - 100),
        ("ignore_index", lambda v: rlk.linear_logprob(h, w, labels, ignore_index=v), -2 ** 63 - 1),
        ("top_k", lambda v: rlk.linear_divergence(h, w, h, w, top_k=v), 2 ** 32 + 3),
        ("group_size", lambda v: rlk.group_advantage(np.arange(4, dtype=np.float32), v), 2 ** 64 + 2),
    ]
    for field, call, bad in calls:
        with pytest.raises(rlk.InvalidArgument, match="%s: %d is outside what the library's" % (field, bad)):
            call(bad)
    with pytest.raises(rlk.InvalidArgument, match="ignore_index: 2.5 is not an integer"):
        rlk.logprob(logits, labels, ignore_index=2.5)
    # integral values of other types are still taken: numpy integers, 2.0
    want = rlk.logprob(logits, labels, ignore_index=-100).logp
    for v in (np.int64(-100), -100.0):
        np.testing.assert_array_equal(rlk.logprob(logits, labels, ignore_index=v).logp, want)


def test_a_device_ordinal_is_refused_where_it_means_nothing(host):
    """The host backend is device 0 alone; an ordinal past int would wrap to another."""
    with pytest.raises(rlk.InvalidArgument, match="one device, 0"):
        rlk.Context("host", 1)
    with pytest.raises(rlk.InvalidArgument, match="device: 4294967296 is outside"):
        rlk.Context("host", 2 ** 32)


def test_a_number_setting_that_is_no_number_is_refused(host):
    """A float setting given a tensor of several values or a string: InvalidArgument naming it,
    not torch's or Python's own error from inside the call."""
    rng = np.random.default_rng(6)
    logits = rng.standard_normal((3, 7)).astype(np.float32)
    labels = np.array([0, 3, 6], np.int64)
    for bad in (np.array([0.5, 0.7]), "hot"):
        with pytest.raises(rlk.InvalidArgument, match="temperature: .* is not a number"):
            rlk.logprob(logits, labels, temperature=bad)
