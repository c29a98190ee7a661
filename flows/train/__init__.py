"""Training: objectives for energy targets (reverse KL, forward KL on samples), see :mod:`flows.train.energy`."""

from flows.train.energy import ForwardKL, ReverseKL, annealed_temperature, forward_kl_loss, reverse_kl_loss

__all__ = ["ForwardKL", "ReverseKL", "annealed_temperature", "forward_kl_loss", "reverse_kl_loss"]
