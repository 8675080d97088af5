"""The decoder's linear layer: y = x @ W^T, with our GEMV for decode-sized CPU inputs.

Batch-1 decode multiplies one row by every weight matrix; torch's stock CPU kernels reach a
third of the memory bandwidth there, `cpu_gemv.c` most of it. Which kernel runs is a
property of the model, fixed when it is built (`KernelChoice.native`), the same for the
plain and the fast path, so both round identically. Inputs of up to `NATIVE_MAX_ROWS` rows (a decode step, a speculative
verification) use the GEMV, which gives each row the same bits whatever the row count;
larger ones (prefill, scoring) and other devices use torch.

A `Linear` may hold its weight quantised (`quantize_(scheme)`, kernels/quant.py): then it
keeps `qweight` and `scales` instead of `weight`; decode-sized inputs use the quantised GEMV
(`cpu_quant_gemv.c` on CPU, the Triton kernel of kernels/cuda_quant.py on CUDA), everything
else multiplies by the dequantised matrix. Under `gguf` (kernels/gguf.py, CPU only) it keeps a
GGUF's blocks as `qweight` (uint8) and their `layout`, and decode uses `cpu_gguf_gemv.c`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastgemma import kernels
from fastgemma.kernels import gguf, native, quant
from fastgemma.kernels.quant import QuantScheme
from fastgemma.kernels.schemes import GGUF

NATIVE_MAX_ROWS = 16  # inputs of up to this many rows use the native (row-invariant) GEMVs


def native_rows(x: torch.Tensor, use_native: bool) -> bool:
    """Whether x [M, K] goes through the native GEMVs."""
    return use_native and x.shape[0] <= NATIVE_MAX_ROWS and x.device.type == "cpu"


def linear(x: torch.Tensor, weight: torch.Tensor, use_native: bool) -> torch.Tensor:
    """x: [M, K], weight: [N, K] -> [M, N]."""
    if not (native_rows(x, use_native) and x.dtype == weight.dtype):
        return F.linear(x, weight)
    lib = native.load()
    if lib is None or x.dtype not in (torch.bfloat16, torch.float32) or not weight.is_contiguous():
        return F.linear(x, weight)
    x = x.contiguous()
    (M, K), N = x.shape, weight.shape[0]
    y = torch.empty((M, N), dtype=x.dtype)
    if x.dtype == torch.bfloat16:
        lib.gemv_bf16(weight.data_ptr(), x.data_ptr(), y.data_ptr(), M, N, K, 0)
    else:
        lib.gemv_f32(weight.data_ptr(), x.data_ptr(), y.data_ptr(), M, N, K)
    return y


class Linear(nn.Linear):
    """nn.Linear without bias whose forward picks the kernel above (or the quantised one)."""

    scheme: QuantScheme | None = None  # set by quantize_; then `weight` is gone

    def __init__(self, in_features: int, out_features: int, native: bool = False):
        super().__init__(in_features, out_features, bias=False)
        self.use_native = native  # decode-sized CPU inputs through the native GEMVs

    def quantize_(
        self,
        scheme: QuantScheme,
        codes: tuple[torch.Tensor, torch.Tensor] | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Store the weight as `scheme` (int4 falls back to int8 for ragged K): from the
        current weight, or from given codes: (qweight, scales) of a quantised checkpoint, or
        under `gguf` (blocks, layout) read from a GGUF (then `dtype` is the model's: the
        dtype prefill dequantises to)."""
        if scheme == GGUF:
            if codes is None:
                raise ValueError("gguf keeps a GGUF file's blocks; it cannot quantise a weight")
            blocks, layout = codes
            assert blocks.dtype == torch.uint8 and int(layout[:, 1].sum()) == self.out_features, layout
            self.scheme, self._dtype = GGUF, dtype or self.weight.dtype
            del self.weight
            self.register_buffer("qweight", blocks.reshape(-1).contiguous())
            self.register_buffer("layout", layout.to(torch.int64).contiguous())
            return
        self.scheme = quant.scheme_for(scheme, self.in_features)
        qweight, scales = codes if codes is not None else quant.quantize(self.weight, self.scheme)
        device = qweight.device if codes is not None else self.weight.device
        self._dtype = dtype or self.weight.dtype
        del self.weight
        self.register_buffer("qweight", qweight.to(device).contiguous())
        self.register_buffer("scales", scales.to(device=device, dtype=torch.float32).contiguous())

    def dequantized_weight(self) -> torch.Tensor:
        if self.scheme == GGUF:
            return gguf.dequantize(self.qweight, self.layout, self.in_features, self._dtype, native.load())
        return quant.dequantize(self.qweight, self.scales, self.scheme, self._dtype)

    def nbytes(self) -> int:
        """Bytes of weight data a product with this layer reads."""
        if self.scheme is None:
            return self.weight.numel() * self.weight.element_size()
        if self.scheme == GGUF:
            return self.qweight.numel()
        return self.qweight.numel() * self.qweight.element_size() + self.scales.numel() * 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scheme is None:
            return linear(x, self.weight, self.use_native)
        if self.scheme == GGUF:
            lib = native.load() if native_rows(x, self.use_native) else None
            if lib is not None and x.dtype in (torch.bfloat16, torch.float32):
                return gguf.matvec(x, self.qweight, self.layout, lib)
            return F.linear(x, self.dequantized_weight().to(x.dtype))
        if (kernels.use_triton(x) and x.shape[0] <= NATIVE_MAX_ROWS and self.in_features % 32 == 0
                and x.dtype in (torch.bfloat16, torch.float32)):
            from fastgemma.kernels.cuda_quant import quant_matmul  # Triton: imported on CUDA only

            return quant_matmul(x, self.qweight, self.scales, self.scheme)
        lib = native.load() if native_rows(x, self.use_native) else None
        if lib is not None and x.dtype in (torch.bfloat16, torch.float32):
            return quant.matvec(x, self.qweight, self.scales, self.scheme, lib)
        return F.linear(x, self.dequantized_weight().to(x.dtype))
