"""Transforms that map a chi-squared variable to an approximately standard normal one.

SMSO's PV layer outputs ``z_j = w_j^T Y w_j``. Under the Gaussian assumption the scaled value
``q_j = (n - 1) z_j / (w_j^T Sigma w_j)`` follows ``chi2_k`` with ``k = n - 1`` degrees of freedom.
Each transform below takes ``q`` (any shape) and ``k`` and returns a value that is close to
``N(0, 1)`` when ``q ~ chi2_k`` (paper Sec. 3.1 and Table 3):

======== ================================================== =======================================
name     formula                                            approximation
======== ================================================== =======================================
sqrt     ``sqrt(2 q) - sqrt(2 k - 1)``                      Fisher: ``sqrt(2q) ~ N(sqrt(2k-1), 1)``
cuberoot ``((q / k)^(1/3) - (1 - 2/(9k))) / sqrt(2/(9k))``  Wilson-Hilferty
log      ``(log(q / k) + 1/k) / sqrt(2 / k)``               delta method, mean to second order
none     ``(q - k) / sqrt(2 k)``                            exact mean and variance of chi2_k
======== ================================================== =======================================

``q`` is clamped at ``eps`` first, so a constant input (``q = 0``) gives finite values and finite
gradients for every transform.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["TRANSFORMS", "chi2_to_normal"]

#: Lower clamp of ``q`` before the transform: keeps ``d sqrt(q)/dq`` and ``log q`` finite at q = 0.
_EPS = 1e-6


def _sqrt(q: Tensor, k: Tensor) -> Tensor:
    return torch.sqrt(2.0 * q) - torch.sqrt(2.0 * k - 1.0)


def _cuberoot(q: Tensor, k: Tensor) -> Tensor:
    var = 2.0 / (9.0 * k)
    return (torch.pow(q / k, 1.0 / 3.0) - (1.0 - var)) / torch.sqrt(var)


def _log(q: Tensor, k: Tensor) -> Tensor:
    return (torch.log(q / k) + 1.0 / k) / torch.sqrt(2.0 / k)


def _none(q: Tensor, k: Tensor) -> Tensor:
    return (q - k) / torch.sqrt(2.0 * k)


#: Registry of the transforms of paper Table 3, by name.
TRANSFORMS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "sqrt": _sqrt,
    "cuberoot": _cuberoot,
    "log": _log,
    "none": _none,
}


def chi2_to_normal(q: Tensor, k: int | float | Tensor, transform: str = "sqrt") -> Tensor:
    """Map ``q ~ chi2_k`` to an approximately ``N(0, 1)`` variable.

    Args:
        q: non-negative tensor of any shape, the scaled PV output ``(n-1) z / (w^T Sigma w)``.
        k: degrees of freedom, ``n - 1`` for a covariance over ``n`` positions; must be >= 1.
            A 0-d tensor is accepted so that an exported graph can take ``n`` from its input shape.
        transform: one of ``TRANSFORMS``.

    Returns:
        A tensor of the shape of ``q``.
    """
    try:
        fn = TRANSFORMS[transform]
    except KeyError:
        raise ValueError(
            f"unknown transform {transform!r}; valid transforms: {', '.join(TRANSFORMS)}"
        ) from None
    k_t = torch.as_tensor(k, dtype=q.dtype, device=q.device)
    return fn(q.clamp_min(_EPS), k_t)
