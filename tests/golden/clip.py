#!/usr/bin/env python3
"""tests/golden/clip.py -> tests/golden/clip.json: PyTorch's gradient clipping on given gradients.

Runs torch.nn.utils.clip_grad_norm_ (norm types 2, inf, 1 and 3, with max_norm below the total norm, so the
gradients are scaled, and above it, so they are kept) and torch.nn.utils.clip_grad_value_ on three gradients of
float32 and of float64, and records the gradients before and after and the returned total norm.
tests/test_grad_scaler.cpp replays every case (f32 within 1e-6 relative, f64 within 1e-12).

Format (tests/golden.h): {"torch", "script", "cases": [...]}, each case
  {"name", "kind": "norm" | "value", "dtype": "f32" | "f64", "grads": [tensor...], "clipped": [tensor...],
   norm: "norm_type": number or "inf", "max_norm", "total_norm": tensor (0-d);  value: "clip_value"}.

Run: python3 tests/golden/clip.py   (Debian's python3-torch)
"""
import json
import math
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(3, 4), (5,), (2, 2, 3)]


def tensor_json(t):
    t = t.detach().cpu()
    return {"shape": list(t.shape), "dtype": {torch.float32: "f32", torch.float64: "f64"}[t.dtype],
            "values": [float(v) for v in t.reshape(-1).tolist()]}


def make_params(dtype, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    params = []
    for shape in SHAPES:
        p = torch.zeros(shape, dtype=dtype, requires_grad=True)
        p.grad = (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)
        params.append(p)
    return params


def main():
    cases = []
    for dtype, dname in ((torch.float32, "f32"), (torch.float64, "f64")):
        seed = 1
        for norm_type in (2.0, math.inf, 1.0, 3.0):
            for max_norm_factor, what in ((0.25, "clipped"), (4.0, "kept")):
                seed += 1
                params = make_params(dtype, seed, 1.5)
                before = [tensor_json(p.grad) for p in params]
                # max_norm relative to the true norm, so both branches of the clamp are taken.
                with torch.no_grad():
                    all_grads = torch.cat([p.grad.reshape(-1).double() for p in params])
                    true_norm = float(torch.linalg.vector_norm(all_grads, norm_type))
                max_norm = round(true_norm * max_norm_factor, 3)
                total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
                cases.append({"name": f"norm {norm_type} {dname} {what}", "kind": "norm", "dtype": dname,
                              "norm_type": "inf" if math.isinf(norm_type) else norm_type, "max_norm": max_norm,
                              "grads": before, "total_norm": tensor_json(total),
                              "clipped": [tensor_json(p.grad) for p in params]})
        for clip_value in (0.5, 2.0):
            seed += 1
            params = make_params(dtype, seed, 1.5)
            before = [tensor_json(p.grad) for p in params]
            torch.nn.utils.clip_grad_value_(params, clip_value)
            cases.append({"name": f"value {clip_value} {dname}", "kind": "value", "dtype": dname,
                          "clip_value": clip_value, "grads": before,
                          "clipped": [tensor_json(p.grad) for p in params]})
    out = {"torch": torch.__version__, "script": "clip.py", "cases": cases}
    with open(os.path.join(HERE, "clip.json"), "w") as f:  # one case a line
        head = json.dumps({k: v for k, v in out.items() if k != "cases"})[:-1]
        f.write(head + ', "cases": [\n' + ",\n".join(json.dumps(c) for c in cases) + "\n]}\n")
    print(f"wrote {len(cases)} cases to clip.json (torch {torch.__version__})")


if __name__ == "__main__":
    main()
