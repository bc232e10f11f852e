r"""MXFP8 (OCP microscaling: E4M3 elements, one E8M0 scale per 32 contiguous elements of the last dim) in plain
PyTorch: the reference every MXFP8 kernel of the repo is checked against, plus MXNorm's correction constants.

The rules are torchao 0.18.0's ``torchao.prototype.mx_formats.mx_tensor.to_mx`` (pinned in
``requirements/upstream.txt``; ``tests/test_mxfp8.py`` compares both outputs as uint8 on random data and on
the corner cases). Nothing here imports torchao, so the GPU checks run where torchao is not installed.

Per block of 32 elements ``v`` (fp32; bf16/fp16 inputs are widened exactly)::

    amax  = max_i |v_i|                     NaN if any v_i is NaN (torch.amax semantics), Inf if any is Inf
    FLOOR (OCP MX v1.0, torchao's default):
          scale byte s = 255 if amax is NaN else max(E(amax) - 8, 0)         E(.) = biased fp32 exponent field
          (so Inf -> 247, fp32-subnormal or zero amax -> 0; amax in [256, 448] * 2^k -> data may saturate)
          data = v / 2^(max(s, 1) - 127)    (torchao clamps the fp32 scale to 2^-126: byte 0 divides by 2^-126)
                 v / inf                    for s = 255 (finite v -> +-0, Inf/NaN -> NaN)
    RCEIL (cuBLAS / Transformer Engine; torchao ``ScaleCalculationMode.RCEIL``):
          d = fl(amax / 448)                (IEEE division, round to nearest even)
          s = 255 if NaN, 254 if Inf, else ceil(log2(d)) + 127 clamped to [0, 254], computed exactly from the
              bits of d (normal d: E(d) + (mantissa(d) != 0); subnormal d: 0 if d <= 2^-127 else 1)
          data = v * r,  r = NaN (s = 255), 2^-127 (s = 254), 1.0 (s = 0), 2^(127 - s) otherwise
    element: clamp(data, -448, 448) (NaN kept), then round to nearest even to E4M3 (subnormals kept)

Known difference to torchao 0.18.0 (RCEIL only): torchao computes ``ceil(torch.log2(d))`` in fp32, and fp32
``log2`` rounds ``log2(2^k (1 + delta))`` down to ``k`` when ``delta`` is a few ulps and ``|k| >= 4``, giving a
scale one binade too small (and saturated data). We use the exact rule above, which is what the hardware
instruction ``cvt.rp.satfinite.ue8m0x2.f32`` and later torchao versions compute. With bf16 inputs the case
cannot occur (``amax / 448`` of an 8-bit mantissa is either a power of two or >= 1/224 away from one); with fp32
inputs it needs ``d`` within ~2^-21 of a power of two (``tests/test_mxfp8.py`` shows one such value).

Kernels compute the same scales from the bits of ``amax`` without a division (``rceil_from_amax_bits``):
``s = clamp(E(amax) - 8 + (mantissa(amax) > 0x600000), 0, 254)``, except ``amax`` bits ``0x04600001`` -> 0
(there ``amax / 448`` rounds down to the subnormal 2^-127); 448 = 1.75 * 2^8 and 1.75 is mantissa 0x600000.

Dequantize (torchao ``to_dtype``): ``data * 2^(s - 127)``, a block with ``s = 255`` is all NaN. Note that with
FLOOR a block whose amax is below 2^-118 was quantized with 2^-126 but dequantizes with 2^-127 (torchao's rule).

MXNorm correction constants: ``correction_constant(p, B) = (E[m^p])^(1/p)`` with ``m`` the max of ``B`` i.i.d.
``|N(0, 1)|``, i.e. the almost-sure limit of ``G^(p) / RMS`` for Gaussian rows (McLean et al., "MXNorm: Reusing
MXFP block scales for efficient tensor normalisation", arXiv 2603.13180, Theorem 1). Computed by numerical
integration: ``E[m^p] = int_0^inf p t^(p-1) (1 - erf(t / sqrt 2)^B) dt``.

Sources: OCP Microscaling Formats (MX) v1.0 spec; torchao ``mx_formats``
(https://github.com/pytorch/ao/tree/main/torchao/prototype/mx_formats); cuBLAS "1D block quantization"
(https://docs.nvidia.com/cuda/cublas/#d-block-quantization).
"""

from __future__ import annotations

import math

import torch

BLOCK_SIZE = 32
E4M3_MAX = 448.0
E4M3_EMAX = 8  # floor(log2(448))
E8M0_BIAS = 127
E8M0_NAN = 255
SCALE_MODES = ("floor", "rceil")
_RCEIL_SUBNORMAL_EXCEPTION = 0x04600001  # amax bits whose amax / 448 rounds down to 2^-127 (see module docstring)


def check_scale_mode(mode: str) -> str:
    """Return ``mode`` ("floor" or "rceil", case-insensitive, lower-cased); ValueError listing the choices."""
    m = str(mode).lower() if isinstance(mode, str) else mode
    if m not in SCALE_MODES:
        raise ValueError(f"unknown scale_mode {mode!r}; choices: {', '.join(SCALE_MODES)}")
    return m


def _check_blocked(x: torch.Tensor, block: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError("x must be a torch.Tensor")
    if x.dim() < 1 or x.shape[-1] % block:
        raise ValueError(f"the last dimension ({tuple(x.shape)[-1:]}) must be a multiple of the block size {block}")


def _bits(v: torch.Tensor) -> torch.Tensor:
    return v.contiguous().view(torch.int32)


def block_amax(x: torch.Tensor, block: int = BLOCK_SIZE) -> torch.Tensor:
    """Per-block ``max |x|`` in fp32: ``x [..., D]`` -> ``[..., D / block]``. A NaN anywhere in a block gives NaN
    (as ``torch.amax``), an Inf gives Inf. Computed as an integer max over the sign-cleared fp32 bits (NaN
    bit patterns order above Inf), the way the kernels do it. ValueError if D is not a multiple of ``block``."""
    _check_blocked(x, block)
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // block, block)
    mag = _bits(xb) & 0x7FFFFFFF
    return mag.amax(-1).view(torch.float32)


def floor_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """FLOOR (OCP) E8M0 scale bytes (uint8) of fp32 block maxima: ``255`` for NaN, else ``max(E(amax) - 8, 0)``."""
    a = amax.float()
    e = (_bits(a) >> 23) & 0xFF
    s = torch.clamp(e - E4M3_EMAX, min=0)
    return torch.where(torch.isnan(a), E8M0_NAN, s).to(torch.uint8)


def rceil_from_descale(amax: torch.Tensor) -> torch.Tensor:
    """RCEIL E8M0 scale bytes by the definition: ``d = fl(amax / 448)``, ``ceil(log2(d)) + 127`` exactly from the
    bits of ``d`` (clamped to [0, 254]); NaN -> 255, Inf -> 254."""
    a = amax.float()
    d = a / E4M3_MAX
    bd = _bits(d)
    ed, md = (bd >> 23) & 0xFF, bd & 0x7FFFFF
    normal = torch.clamp(ed + (md != 0).to(torch.int32), max=254)
    sub = (md > (1 << 22)).to(torch.int32)  # subnormal d = md * 2^-149: ceil(log2 d) <= -127 iff md <= 2^22
    s = torch.where(ed == 0, sub, normal)
    s = torch.where(torch.isinf(a), 254, s)
    return torch.where(torch.isnan(a), E8M0_NAN, s).to(torch.uint8)


def rceil_from_amax_bits(amax: torch.Tensor) -> torch.Tensor:
    """The same bytes as ``rceil_from_descale`` without a division (what the kernels compute):
    ``clamp(E(amax) - 8 + (mantissa(amax) > 0x600000), 0, 254)``, bits ``0x04600001`` -> 0, Inf -> 254, NaN -> 255."""
    a = amax.float()
    b = _bits(a) & 0x7FFFFFFF
    e, m = b >> 23, b & 0x7FFFFF
    s = torch.clamp(e - E4M3_EMAX + (m > 0x600000).to(torch.int32), 0, 254)
    s = torch.where(b == _RCEIL_SUBNORMAL_EXCEPTION, 0, s)
    s = torch.where(torch.isinf(a), 254, s)
    return torch.where(torch.isnan(a), E8M0_NAN, s).to(torch.uint8)


def scales_from_amax(amax: torch.Tensor, scale_mode: str = "floor") -> torch.Tensor:
    """E8M0 scale bytes (uint8, same shape) of fp32 block maxima for ``scale_mode`` ("floor" or "rceil")."""
    mode = check_scale_mode(scale_mode)
    return floor_from_amax(amax) if mode == "floor" else rceil_from_descale(amax)


def data_multiplier(scales: torch.Tensor, scale_mode: str = "floor") -> torch.Tensor:
    """The fp32 factor each element of a block is multiplied by before the E4M3 cast (module docstring):
    FLOOR ``2^(127 - max(s, 1))`` and 0 for ``s = 255`` (equal to torchao's division by ``2^(s-127)`` / by inf);
    RCEIL NaN / 2^-127 / 1.0 / ``2^(127 - s)`` for ``s`` = 255 / 254 / 0 / otherwise."""
    mode = check_scale_mode(scale_mode)
    s = scales.to(torch.int32)
    if mode == "floor":
        mult = ((254 - torch.clamp(s, min=1)) << 23).view(torch.float32)
        return torch.where(s == E8M0_NAN, torch.zeros_like(mult), mult)
    mult = ((254 - torch.clamp(s, 1, 253)) << 23).view(torch.float32)
    mult = torch.where(s == 0, torch.ones_like(mult), mult)
    mult = torch.where(s == 254, torch.full_like(mult, 2.0 ** -127), mult)
    return torch.where(s == E8M0_NAN, torch.full_like(mult, float("nan")), mult)


def cast_e4m3(v: torch.Tensor) -> torch.Tensor:
    """Saturating round-to-nearest-even cast of fp32 ``v`` to ``torch.float8_e4m3fn`` (|v| > 448 -> +-448,
    Inf -> +-448, NaN -> NaN, subnormals kept): clamp, then torch's cast (what ``cvt.rn.satfinite`` does)."""
    return torch.clamp(v.float(), -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def e4m3_rne_codes(v: torch.Tensor) -> torch.Tensor:
    """The E4M3 codes (uint8) of ``cast_e4m3(v)`` computed with integer and fp32 adds only: the software cast
    of the Triton kernels (used where no hardware cvt exists, e.g. the Triton interpreter, whose fp8 casts are
    wrong). Normal range: round the fp32 mantissa to 3 bits (add 0x7FFFF + lsb, shift by 20), rebias
    127 -> 7; below 2^-6: ``rint(|v| * 2^9)`` by adding and subtracting 2^23 (round to nearest even). NaN ->
    0x7F, sign in bit 7."""
    f = v.float()
    b = _bits(f)
    a = torch.clamp(f.abs(), max=E4M3_MAX)  # NaN stays NaN
    ab = _bits(a)
    normal = ((ab + 0x7FFFF + ((ab >> 20) & 1)) >> 20) - ((127 - 7) << 3)
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(torch.int32)
    code = torch.where(a < 2.0 ** -6, sub, normal)
    code = torch.where(torch.isnan(f), 0x7F, code)
    code = code | ((b >> 24) & 0x80)
    return code.to(torch.uint8)


def quantize(x: torch.Tensor, scale_mode: str = "floor", block: int = BLOCK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 cast of ``x [..., D]`` (any float dtype; widened to fp32 exactly for bf16/fp16/fp32): returns
    ``(data float8_e4m3fn [..., D], scales uint8 [..., D / block])`` per the module docstring (torchao 0.18
    ``to_mx`` semantics; torchao returns ``(scale, data)`` and e8m0 scales, the same bytes). ValueError if D is
    not a multiple of ``block`` or the scale mode is unknown."""
    mode = check_scale_mode(scale_mode)
    _check_blocked(x, block)
    xf = x.float().contiguous()
    amax = block_amax(xf, block)
    s = scales_from_amax(amax, mode)
    xb = xf.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    data = cast_e4m3(xb * data_multiplier(s, mode).unsqueeze(-1)).reshape(x.shape)
    return data, s


def dequantize(data: torch.Tensor, scales: torch.Tensor, block: int = BLOCK_SIZE,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``data * 2^(s - 127)`` per block (``s = 255``: NaN block), as torchao's ``to_dtype``. ``data [..., D]``
    float8_e4m3fn (or its uint8 codes), ``scales [..., D / block]`` uint8 (or float8_e8m0fnu)."""
    if data.dtype == torch.uint8:
        data = data.view(torch.float8_e4m3fn)
    s = scales.view(torch.uint8) if scales.dtype != torch.uint8 else scales
    if data.shape[:-1] != s.shape[:-1] or data.shape[-1] != s.shape[-1] * block:
        raise ValueError(f"data {tuple(data.shape)} and scales {tuple(s.shape)} do not match block {block}")
    f = torch.pow(torch.full(s.shape, 2.0, device=s.device), s.to(torch.float32) - E8M0_BIAS)
    f = torch.where(s == E8M0_NAN, float("nan"), f)
    d = data.float().reshape(*s.shape, block) * f.unsqueeze(-1)
    return d.reshape(data.shape).to(dtype)


def e4m3_ordinal(codes: torch.Tensor) -> torch.Tensor:
    """Map E4M3 codes (uint8 or float8_e4m3fn) to integers ordered like the values they encode (+-0 -> 0);
    neighbouring representable values differ by 1. NaN codes (0x7F, 0xFF) map to 1 << 20."""
    c = codes.view(torch.uint8).to(torch.int32) if codes.dtype != torch.uint8 else codes.to(torch.int32)
    mag = c & 0x7F
    o = torch.where(c & 0x80 != 0, -mag, mag)
    return torch.where(mag == 0x7F, 1 << 20, o)


def code_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``|ordinal(a) - ordinal(b)|`` per element (E4M3 codes): 0 for equal values (incl. +0/-0 and NaN/NaN),
    1 for neighbouring values, >= 2^19 when exactly one side is NaN."""
    return (e4m3_ordinal(a) - e4m3_ordinal(b)).abs()


def correction_constant(p: int, block: int = BLOCK_SIZE) -> float:
    """MXNorm's ``c(p, B) = (E[m^p])^(1/p)``, ``m`` = max of ``block`` i.i.d. ``|N(0,1)|`` (fp64 Simpson on
    [0, 16], 2^17 intervals; ``1 - erf^B`` via ``expm1``/``log1p`` of ``erfc`` so the tail keeps its digits).
    c(1, 32) = 2.347079, c(2, 32) = 2.389457, c(1, 16) = 2.077204, c(2, 16) = 2.132950. ValueError unless
    ``p >= 1`` and ``block >= 1`` are integers."""
    for name, v in (("p", p), ("block", block)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return _correction_constant(p, block)


_C_CACHE: dict = {}


def _correction_constant(p: int, block: int) -> float:
    key = (p, block)
    if key not in _C_CACHE:
        n = 1 << 17
        t = torch.linspace(0.0, 16.0, n + 1, dtype=torch.float64)
        erfc = torch.special.erfc(t / math.sqrt(2.0))
        survival = -torch.expm1(block * torch.log1p(-erfc))  # P(m > t) = 1 - erf(t / sqrt 2)^B
        f = p * t.pow(p - 1) * survival
        h = 16.0 / n
        moment = (h / 3.0) * (f[0] + f[-1] + 4.0 * f[1:-1:2].sum() + 2.0 * f[2:-1:2].sum())
        _C_CACHE[key] = float(moment.item() ** (1.0 / p))
    return _C_CACHE[key]
