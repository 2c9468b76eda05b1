"""The loss functions against values computed by hand (log sigmoid written out as -log(1 + e^-x))."""

import math

import pytest
import torch

from losses import dpo_sigmoid, nca_p_loss, nca_pair


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def test_dpo_sigmoid_by_hand():
    chosen, rejected = torch.tensor([2.0, -1.0, 0.0]), torch.tensor([1.0, 3.0, 0.0])
    beta = 0.5
    expected = [-log_sigmoid(0.5 * (2 - 1)), -log_sigmoid(0.5 * (-1 - 3)), math.log(2)]
    assert dpo_sigmoid(chosen, rejected, beta).tolist() == pytest.approx(expected, rel=1e-6)


def test_nca_pair_by_hand():
    chosen, rejected = torch.tensor([10.0, -20.0]), torch.tensor([-30.0, 5.0])
    beta = 0.1
    expected = []
    for c, r in zip([10.0, -20.0], [-30.0, 5.0]):
        rc, rr = beta * c, beta * r
        expected.append(-log_sigmoid(rc) - 0.5 * log_sigmoid(-rc) - 0.5 * log_sigmoid(-rr))
    assert nca_pair(chosen, rejected, beta).tolist() == pytest.approx(expected, rel=1e-6)
    # At zero log-ratios every term is log 2: 1 + 0.5 + 0.5 = 2 log 2.
    assert nca_pair(torch.zeros(1), torch.zeros(1), 0.01).item() == pytest.approx(2 * math.log(2))


def test_nca_p_sums_both_variants():
    chosen = torch.tensor([[1.0, -2.0], [0.0, 4.0]])
    rejected = torch.tensor([[-3.0, 2.0], [1.0, -1.0]])
    beta = 0.01
    per_example = nca_p_loss(chosen, rejected, beta)
    assert per_example.shape == (2,)
    for i in range(2):
        expected = 0.0
        for j in range(2):
            rc, rr = beta * chosen[i, j].item(), beta * rejected[i, j].item()
            expected += -log_sigmoid(rc) - 0.5 * log_sigmoid(-rc) - 0.5 * log_sigmoid(-rr)
        assert per_example[i].item() == pytest.approx(expected, rel=1e-6)
    assert nca_p_loss(torch.zeros(3, 2), torch.zeros(3, 2), 0.01).tolist() == pytest.approx([4 * math.log(2)] * 3)


def test_nca_p_rejects_wrong_shape():
    with pytest.raises(ValueError):
        nca_p_loss(torch.zeros(3), torch.zeros(3), 0.01)


def test_gradients_push_chosen_up():
    chosen = torch.zeros(4, 2, requires_grad=True)
    rejected = torch.zeros(4, 2, requires_grad=True)
    nca_p_loss(chosen, rejected, 0.1).mean().backward()
    assert (chosen.grad < 0).all() and (rejected.grad > 0).all()
