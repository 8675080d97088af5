"""Decode attention for fixed-shape steps (kernels/cuda_attention.py): on a GPU when there is
one, else the same Triton kernels in Triton's interpreter on the CPU (tests/conftest.py;
skipped without triton installed)."""

from __future__ import annotations

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytest.importorskip("triton")

from fastgemma.kernels.cuda_attention import SPLIT, attend_in_place  # noqa: E402
from fastgemma.models.attention import attend  # noqa: E402


def _reference(q, k, v, positions, sliding: bool, ring: int, window: int, scaling: float) -> torch.Tensor:
    """Each row over exactly its visible keys, in position order (fp32)."""
    rows = []
    for t, p in enumerate(positions.tolist()):
        first = max(0, p - window + 1) if sliding else 0
        slots = torch.tensor([x % ring if sliding else x for x in range(first, p + 1)])
        rows.append(attend(q[:, t : t + 1].float(), k[:, slots].float(), v[:, slots].float(), None, scaling, None))
    return torch.cat(rows, dim=1)


# (sliding, slots of the buffer without the scratch one, window, head dim, row positions)
CASES = [
    (False, 600, 0, 64, [0, SPLIT - 1, SPLIT, 513, 599]),  # several splits, split boundaries
    (True, 39, 32, 32, [3, 500, 501, 507, 507]),  # a ring wrapped many times
    (True, 299, 280, 16, [17, 279, 280, 1000, 1001]),  # a window across split boundaries
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sliding, slots, window, hd, positions", CASES)
def test_each_row_attends_over_exactly_its_visible_keys(sliding, slots, window, hd, positions, dtype):
    g = torch.Generator().manual_seed(slots)
    Hkv, H, T = 2, 4, len(positions)
    q = torch.randn(H, T, hd, generator=g).to(dtype)
    k, v = (torch.randn(Hkv, slots + 1, hd, generator=g).to(dtype) for _ in range(2))
    pos = torch.tensor(positions)
    valid = torch.ones(T, dtype=torch.bool)
    valid[-1] = False  # a padding row
    out = attend_in_place(*(t.to(DEVICE) for t in (q, k, v, pos, valid)), sliding, slots, window or 1, 0.3).cpu()
    ref = _reference(q, k, v, pos, sliding, slots, window, 0.3)
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: one rounding of outputs of size ~2
    assert out.dtype == dtype and (out[:, :-1].float() - ref[:, :-1]).abs().max() < tol
    assert (out[:, -1] == 0).all()


def test_a_rows_result_does_not_depend_on_the_other_rows():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, 6, 32, generator=g).to(torch.bfloat16).to(DEVICE)
    k, v = (torch.randn(2, 301, 32, generator=g).to(torch.bfloat16).to(DEVICE) for _ in range(2))
    pos = torch.tensor([40, 41, 42, 290, 291, 291], device=DEVICE)
    valid = torch.tensor([True] * 5 + [False], device=DEVICE)
    for sliding in (False, True):
        full = attend_in_place(q, k, v, pos, valid, sliding, 300, 64, 1.0)
        for t in (0, 3, 4):
            one = attend_in_place(q[:, t : t + 1], k, v, pos[t : t + 1], valid[t : t + 1], sliding, 300, 64, 1.0)
            assert torch.equal(one[:, 0], full[:, t])
