"""The contract: Chain order and shape checks, Inverse, InverseNotAvailable, forward/inverse conveniences."""

from __future__ import annotations

import pytest
import torch

import flows
from flows import Affine, Bijection, Chain, Inverse, InverseNotAvailable, Reverse


def test_chain_applies_in_list_order() -> None:
    shift = Affine(2, shift=1.0)
    double = Affine(2, log_scale=float(torch.tensor(2.0).log()))
    x = torch.tensor([[1.0, 2.0]])
    # (x + 1) * 2 would be the reversed order; list order is x * 2 + 1
    torch.testing.assert_close(Chain(double, shift)(x), torch.tensor([[3.0, 5.0]]))
    torch.testing.assert_close(Chain(shift, double)(x), torch.tensor([[4.0, 6.0]]))


def test_chain_sums_log_dets_and_inverts_in_reverse_order() -> None:
    torch.manual_seed(0)
    a, b = Affine(3, log_scale=0.5), flows.AffineCoupling(3, hidden=(4,))
    flows.testing.perturb_parameters(b)
    chain = Chain(a, b)
    x = torch.randn(7, 3)
    z, ladj = chain.forward_and_log_det(x)
    za, la = a.forward_and_log_det(x)
    zb, lb = b.forward_and_log_det(za)
    torch.testing.assert_close(z, zb)
    torch.testing.assert_close(ladj, la + lb)
    torch.testing.assert_close(chain.inverse(z), x, atol=1e-5, rtol=1e-5)


def test_chain_shape_mismatch_names_both_members() -> None:
    with pytest.raises(
        ValueError, match=r"member 0 \(Affine\) outputs events of shape \(3,\) but member 1 \(Reverse\) expects \(4,\)"
    ):
        Chain(Affine(3), Reverse(4))


def test_chain_rejects_empty_and_non_bijections() -> None:
    with pytest.raises(ValueError, match="at least one transform"):
        Chain()
    with pytest.raises(TypeError, match="member 1 must be a Bijection, got Linear"):
        Chain(Affine(2), torch.nn.Linear(2, 2))


def test_chain_len_iter_index_slice() -> None:
    members = [Affine(2), Reverse(2), Affine(2)]
    chain = Chain(*members)
    assert len(chain) == 3
    assert list(chain) == members
    assert chain[1] is members[1]
    sub = chain[1:]
    assert isinstance(sub, Chain) and len(sub) == 2 and sub[0] is members[1]
    assert Chain(members)[2] is members[2]  # a list is accepted too


def test_inv_swaps_directions_and_shares_parameters() -> None:
    t = Affine(2, shift=1.0, log_scale=0.3)
    x = torch.randn(4, 2)
    z, ladj = t.forward_and_log_det(x)
    x2, ladj2 = t.inv.forward_and_log_det(z)
    torch.testing.assert_close(x2, x)
    torch.testing.assert_close(ladj2, -ladj)
    assert t.inv.inv is t
    assert isinstance(t.inv, Inverse)
    assert next(iter(t.inv.parameters())) is next(iter(t.parameters()))


def test_missing_inverse_raises_named_error() -> None:
    class ForwardOnly(Bijection):
        def forward_and_log_det(self, x, context=None):
            return x, x.new_zeros(x.shape[:-1])

    t = ForwardOnly(2)
    with pytest.raises(InverseNotAvailable, match="ForwardOnly has no closed-form inverse"):
        t.inverse(torch.zeros(1, 2))
    assert issubclass(InverseNotAvailable, NotImplementedError)


def test_forward_returns_a_tensor_and_checks_the_event_shape() -> None:
    t = Affine(3)
    out = t(torch.zeros(2, 3))
    assert isinstance(out, torch.Tensor)
    with pytest.raises(ValueError, match=r"Affine: expected input of shape \(\*batch, 3\), got \(2, 4\)"):
        t(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="latent input"):
        t.inverse(torch.zeros(5))


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValueError, match="positive sizes"):
        Affine(0)
    with pytest.raises(ValueError, match="mask of shape"):
        flows.AffineCoupling(4, mask=[True, False])
    with pytest.raises(ValueError, match="keep some entries and transform others"):
        flows.AffineCoupling(3, mask=[True, True, True])
    with pytest.raises(ValueError, match="permutation of range"):
        flows.Permutation(3, [0, 0, 1])
    with pytest.raises(ValueError, match="no default conditioner"):
        flows.AffineCoupling((2, 4, 4))
    with pytest.raises(ValueError, match="init 'identity' or 'orthogonal'"):
        flows.LULinear(3, init="random")
    with pytest.raises(ValueError, match=r"0 <= alpha < 0\.5"):
        flows.Logit(2, alpha=0.5)


def test_logit_and_sigmoid_domain_errors() -> None:
    with pytest.raises(ValueError, match=r"Logit: expected inputs in \(0, 1\), got values in \[-0.1, 0.5\]"):
        flows.Logit(2)(torch.tensor([[-0.1, 0.5]]))
    with pytest.raises(ValueError, match=r"expected inputs in \(-0\.0555556, 1\.05556\)"):
        flows.Logit(2, alpha=0.05)(torch.tensor([[0.0, 1.5]]))
    flows.Logit(2, alpha=0.05)(torch.tensor([[0.0, 1.0]]))  # closed interval is fine with alpha > 0
    # and whatever the inverse produces is accepted back by the forward pass
    t = flows.Logit(2, alpha=0.05)
    x = t.inverse(torch.tensor([[-12.0, 12.0]]))
    assert x.min() < 0 and x.max() > 1
    torch.testing.assert_close(t(x), torch.tensor([[-12.0, 12.0]]), atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError, match=r"Sigmoid: expected inputs in \(0, 1\)"):
        flows.Sigmoid(1).inverse(torch.tensor([[1.0]]))
    with pytest.raises(ValueError, match=r"got values in \[nan"):
        flows.Logit(1)(torch.tensor([[float("nan")]]))


def test_conditional_coupling_requires_context() -> None:
    t = flows.AffineCoupling(4, 2, hidden=(4,))
    with pytest.raises(ValueError, match=r"expected a context of shape \(\*batch, 2\), got None"):
        t(torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"expected a context of shape \(\*batch, 2\), got \(3, 5\)"):
        t(torch.zeros(3, 4), context=torch.zeros(3, 5))
    # a single context broadcasts over the batch
    assert t(torch.zeros(3, 4), context=torch.zeros(2)).shape == (3, 4)


def test_actnorm_initialises_once_and_survives_reload() -> None:
    torch.manual_seed(0)
    t = flows.ActNorm2d(3)
    x = 5 + 3 * torch.randn(64, 3, 4, 4)
    z = t(x)
    assert bool(t.initialized)
    torch.testing.assert_close(z.mean((0, 2, 3)), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(z.std((0, 2, 3), unbiased=False), torch.ones(3), atol=1e-5, rtol=0)
    scale = t.log_scale.detach().clone()
    t(torch.randn(8, 3, 4, 4))  # a second batch does not re-initialise
    assert torch.equal(t.log_scale, scale)
    reloaded = flows.ActNorm2d(3)
    reloaded.load_state_dict(t.state_dict())
    reloaded.train()
    reloaded(torch.randn(8, 3, 4, 4))
    assert torch.equal(reloaded.log_scale, scale)


def test_actnorm_guards_zero_spread() -> None:
    t = flows.ActNorm(2)
    x = torch.stack([torch.full((10,), 3.0), torch.randn(10)], dim=1)
    z, ladj = t.forward_and_log_det(x)
    assert torch.isfinite(z).all() and torch.isfinite(ladj).all()
    assert t.log_scale[0].item() == 0.0  # the constant feature is only centred
    torch.testing.assert_close(z[:, 0], torch.zeros(10))


def test_lu_linear_matches_its_dense_matrix() -> None:
    torch.manual_seed(0)
    t = flows.testing.perturb_parameters(flows.LULinear(5, init="orthogonal").double())
    w = t.weight()
    x = torch.randn(4, 5, dtype=torch.float64)
    z, ladj = t.forward_and_log_det(x)
    torch.testing.assert_close(z, x @ w.T + t.bias)
    torch.testing.assert_close(ladj, torch.linalg.slogdet(w).logabsdet.expand(4))
    torch.testing.assert_close(t.inverse(z), torch.linalg.solve(w, (z - t.bias).T).T)
    # more rows than features takes the other branch (forming W): same answer
    many = torch.randn(12, 5, dtype=torch.float64)
    torch.testing.assert_close(t(many), many @ w.T + t.bias)
    torch.testing.assert_close(t(many[:3]), (many @ w.T + t.bias)[:3])


def test_tensor_only_calls_skip_members_log_dets() -> None:
    """Chain/Inverse forward and inverse use the members' tensor-only methods (a CNF skips its trace)."""

    class Counting(Affine):
        fused = 0

        def forward_and_log_det(self, x, context=None):
            Counting.fused += 1
            return super().forward_and_log_det(x, context)

        def inverse_and_log_det(self, z, context=None):
            Counting.fused += 1
            return super().inverse_and_log_det(z, context)

        def forward(self, x, context=None):
            return x * self.params[..., 1].exp() + self.params[..., 0]

        def inverse(self, z, context=None):
            return (z - self.params[..., 0]) * torch.exp(-self.params[..., 1])

    chain = Chain(Counting(2), Reverse(2), Counting(2))
    x = torch.randn(3, 2)
    z = chain(x)
    torch.testing.assert_close(chain.inverse(z), x)
    torch.testing.assert_close(chain.inv(z), x)
    torch.testing.assert_close(chain.inv.inverse(x), z)
    assert Counting.fused == 0
    chain.forward_and_log_det(x)
    assert Counting.fused == 2


@pytest.mark.parametrize("mask", [None, [True, False, True, False, False], [False, True, True, False, True]])
def test_affine_coupling_fast_path_is_the_generic_affine_coupling(mask) -> None:
    from flows.bijections.coupling import Coupling
    from flows.bijections.transformers import AffineTransformer
    from flows.testing import perturb_parameters

    torch.manual_seed(0)
    fast = perturb_parameters(flows.AffineCoupling(5, 2, mask=mask, clamp=2.0, hidden=(8,)).double(), scale=0.5)
    generic = Coupling(5, 2, transformer=AffineTransformer(2.0), mask=mask, hidden=(8,)).double()
    generic.load_state_dict(fast.state_dict())
    x, c = torch.randn(7, 5, dtype=torch.float64), torch.randn(7, 2, dtype=torch.float64)
    for direction in ("forward_and_log_det", "inverse_and_log_det"):
        y, ladj = getattr(fast, direction)(x, c)
        y_ref, ladj_ref = getattr(generic, direction)(x, c)
        torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-14)
        torch.testing.assert_close(ladj, ladj_ref, rtol=0, atol=1e-13)
        assert ladj.abs().max() > 0.1  # the scales are not at their identity


def test_affine_coupling_names_a_conditioner_of_the_wrong_width() -> None:
    t = flows.AffineCoupling(4, conditioner=torch.nn.Linear(2, 3))
    with pytest.raises(ValueError, match=r"expected the conditioner to return 4 values .* got shape \(6, 3\)"):
        t(torch.zeros(6, 4))
