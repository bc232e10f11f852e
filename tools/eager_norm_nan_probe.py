"""Probe: where does eager ``F.rms_norm`` / ``F.layer_norm`` return non-finite values for a bf16 x with more than
2^31 elements (262144 x 32768)? Prints the first and last non-finite row and the count (GPU only)."""
import torch

F = torch.nn.functional
M, N = 262144, 32768
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(M, N, generator=g, device="cuda", dtype=torch.bfloat16)
for name, fn in (("rms_norm", lambda: F.rms_norm(x, (N,), None, 1e-6)),
                 ("layer_norm", lambda: F.layer_norm(x, (N,), None, None, 1e-6))):
    y = fn()
    bad = (~torch.isfinite(y)).any(-1).nonzero().flatten()
    print(f"eager {name} {M}x{N} ({M * N} elements, torch {torch.__version__}): {bad.numel()} rows non-finite"
          + (f", first {bad[0].item()} (element {bad[0].item() * N}), last {bad[-1].item()}" if bad.numel() else ""))
    del y
