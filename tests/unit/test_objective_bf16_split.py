"""The bf16 split of FP32 operands (objective/bf16_split.py), in torch on CPU, against float64.

The Triton kernels that use it are tested under the interpreter in test_objective_triton.py; here the
scheme itself: the three pieces sum exactly to the FP32 value, the bf16-valued test is exact, and products
over the kept pairs are as accurate as an FP32 GEMM, while dropping pieces is not (the negative control).
"""

from __future__ import annotations

import pytest
import torch

from scalerl_mega.objective.bf16_split import (bf16_pieces, is_bf16_valued, pieces_needed, split_matmul,
                                               split_pairs)


def _wide_fp32(n: int, seed: int = 0) -> torch.Tensor:
    """FP32 values over 60 binades, both signs, random low bits (no bf16-valued structure)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(-30, 30, (n,), generator=g)
            ).float()


def test_three_pieces_sum_exactly_to_every_fp32_value():
    x = torch.cat([_wide_fp32(20000), torch.tensor([0.0, -0.0, 1.0, -1.0, 3.4e38, -3.4e38, 1.17549435e-38,
                                                    torch.finfo(torch.float32).eps, 1 + 2**-23])])
    x0, x1, x2 = bf16_pieces(x, 3)
    assert all(p.dtype == torch.bfloat16 for p in (x0, x1, x2))
    total = x0.double() + x1.double() + x2.double()  # exact in float64 (three 8-bit significands)
    assert torch.equal(total, x.double())
    # the pieces fall in significance: |x1| <= 2^-8 |x0|, |x2| <= 2^-8 |x1| (round to nearest)
    nz = x0 != 0
    assert (x1.double().abs()[nz] <= 2.0**-8 * x0.double().abs()[nz]).all()
    nz1 = x1 != 0
    assert (x2.double().abs()[nz1] <= 2.0**-8 * x1.double().abs()[nz1]).all()
    # and two pieces are not enough: the third carries real bits for most values
    assert (x2 != 0).float().mean() > 0.9


def test_bf16_valued_detection_is_exact():
    x = torch.randn(64, 48).bfloat16().float()
    assert is_bf16_valued(x) and pieces_needed(x) == 1
    assert is_bf16_valued(x.t())  # non-contiguous
    assert is_bf16_valued(x.bfloat16())
    y = x.clone()
    y[17, 5] = torch.nextafter(y[17, 5], torch.tensor(float("inf")))  # one FP32 ulp off one element
    assert not is_bf16_valued(y) and pieces_needed(y) == 3
    assert not is_bf16_valued(x.double())
    assert bf16_pieces(x, 1)[0].float().equal(x)
    with pytest.raises(ValueError, match="n=2 must be one of"):
        bf16_pieces(x, 2)
    with pytest.raises(ValueError, match="dtype torch.float64"):
        bf16_pieces(x.double(), 3)


def test_kept_pairs_are_those_of_significance_at_most_two():
    assert split_pairs(1, 1) == [(0, 0)]
    assert split_pairs(1, 3) == [(0, 2), (0, 1), (0, 0)]
    assert split_pairs(3, 1) == [(2, 0), (1, 0), (0, 0)]
    six = split_pairs(3, 3)
    assert sorted(six) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0)]
    assert [i + j for i, j in six] == sorted((i + j for i, j in six), reverse=True)  # smallest first


def _err(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    """max |got - a@b| over max (|a| @ |b|): the error in units of the product magnitudes (float64)."""
    ref = a.double() @ b.double()
    return float((got.double() - ref).abs().max() / (a.double().abs() @ b.double().abs()).max())


@pytest.mark.parametrize("bf16_valued_a", [True, False], ids=["bf16-valued_a", "fp32_a"])
def test_split_matmul_is_as_accurate_as_fp32_and_fewer_pieces_are_not(bf16_valued_a):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(96, 1024, generator=g)
    if bf16_valued_a:
        a = a.bfloat16().float()
    b = torch.randn(1024, 80, generator=g) * 0.05
    fp32 = _err(a @ b, a, b)  # the yardstick: torch's FP32 GEMM on the same inputs
    got = _err(split_matmul(a, b), a, b)
    assert got <= 2 * fp32 + 2**-24, (got, fp32)
    assert got < 1e-6
    # negative controls: the bf16 rounding of a general operand is ~2^-9 relative
    assert _err(split_matmul(a, b, b_pieces=1), a, b) > 100 * fp32
    if not bf16_valued_a:
        assert _err(split_matmul(a, b, a_pieces=1), a, b) > 100 * fp32
