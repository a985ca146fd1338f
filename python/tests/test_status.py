"""Bad input that only the device sees, made visible: the package's status words (read by
rlk.check_status() where a loop already synchronizes) and RLK_CHECK's check after every call."""
import numpy as np
import pytest

import rlk

torch = pytest.importorskip("torch", reason="the status words are checked through torch and numpy alike; "
                            "these cases use torch tensors")


# the cases run on the host backend (torch CPU tensors)
pytestmark = pytest.mark.usefixtures("host")


@pytest.fixture(autouse=True)
def clean():
    rlk.set_checks(False)
    rlk.status()
    try:
        rlk.check_status()
    except rlk.BadInput:
        pass
    yield
    rlk.set_checks(False)


def head(n=4, h=8, v=10):
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, h, generator=g).bfloat16(), torch.randn(v, h, generator=g).bfloat16()


def test_a_bad_label_is_flagged_until_checked():
    hs, w = head()
    out = rlk.linear_logprob(hs, w, torch.tensor([1, 2, 10, -5]))
    assert torch.isnan(out.logp[2:]).all() and torch.isfinite(out.logp[:2]).all()
    assert rlk.status() == {"linear_logprob": rlk.STATUS_BAD_LABEL}
    rlk.linear_logprob(hs, w, torch.tensor([1, 2, 3, 4]))  # a good call does not clear it
    with pytest.raises(rlk.BadInput, match="linear_logprob: a label outside") as e:
        rlk.check_status()
    assert e.value.found == {"linear_logprob": rlk.STATUS_BAD_LABEL}
    assert rlk.status() == {}
    rlk.check_status()  # cleared: nothing to raise


def test_the_callers_own_status_word_is_left_to_the_caller():
    hs, w = head()
    mine = torch.zeros(1, dtype=torch.int32)
    rlk.linear_logprob(hs, w, torch.tensor([1, 2, 10, 3]), status=mine)
    assert int(mine[0]) == rlk.STATUS_BAD_LABEL
    assert rlk.status() == {}


def test_logits_ops_and_the_sampler_report_too():
    logits = torch.randn(3, 6)
    rlk.logprob(logits, torch.tensor([0, 6, 1]))
    rlk.sample(torch.full((2, 5), float("-inf")), seed=1)
    assert rlk.status() == {"logprob": rlk.STATUS_BAD_LABEL, "sample": rlk.SAMPLE_STATUS_NO_TOKEN}
    with pytest.raises(rlk.BadInput, match="all -inf"):
        rlk.check_status()


def test_checks_raise_at_the_call():
    hs, w = head()
    rlk.set_checks(True)
    with pytest.raises(rlk.BadInput, match="label outside"):
        rlk.linear_logprob(hs, w, torch.tensor([1, 2, 10, 3]))
    rlk.linear_logprob(hs, w, torch.tensor([1, 2, 3, 4]))
    # an op with no status word: NaN in what it wrote
    with pytest.raises(rlk.BadInput, match="group_advantage: an output holds NaN"):
        rlk.group_advantage(torch.tensor([1.0, float("nan"), 2.0, 3.0]), 2)
    # unscorable NaN scores are no error: their advantages are 0
    adv = rlk.group_advantage(torch.tensor([1.0, float("nan"), 2.0, 3.0]), 2, nan_scores="unscorable")
    assert torch.isfinite(adv).all()
    # numpy arrays on the host are checked alike
    with pytest.raises(rlk.BadInput):
        rlk.logprob(np.zeros((2, 4), np.float32), np.array([0, 9], np.int64))


def test_bad_input_survives_pickling():
    """A BadInput raised in a worker process reaches the parent through pickle (multiprocessing,
    a remote trainer): the class, the message and what was found come back."""
    import pickle
    hs, w = head()
    rlk.linear_logprob(hs, w, torch.tensor([1, 2, 10, 3]))
    with pytest.raises(rlk.BadInput) as e:
        rlk.check_status()
    back = pickle.loads(pickle.dumps(e.value))
    assert type(back) is rlk.BadInput and isinstance(back, rlk.InvalidArgument)
    assert str(back) == str(e.value) and back.message == e.value.message
    assert back.found == {"linear_logprob": rlk.STATUS_BAD_LABEL}
