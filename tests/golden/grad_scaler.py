#!/usr/bin/env python3
"""tests/golden/grad_scaler.py -> tests/golden/grad_scaler.json: dynamic loss scaling over 12 SGD steps with
injected infs and NaNs, as PyTorch's GradScaler does it.

Torch 1.13 (Debian's python3-torch) has GradScaler only for CUDA tensors: without a GPU,
torch.cuda.amp.GradScaler() warns "CUDA is not available. Disabling." and passes everything through, and the two
kernels it calls (torch._amp_foreach_non_finite_check_and_unscale_, torch._amp_update_scale_) have no CPU
implementation. So this script reproduces the scaler's documented state machine on the CPU with plain torch ops,
mirroring torch/cuda/amp/grad_scaler.py of that version method by method (CpuGradScaler below: __init__,
_lazy_init_scale_growth_tracker, scale, _unscale_grads_, unscale_, step/_maybe_opt_step, update) and the kernel
rules of aten/src/ATen/native/cuda/AmpKernels.cu (_amp_update_scale_: found_inf -> scale *= backoff, tracker = 0;
else tracker + 1 == growth_interval -> scale *= growth if finite, tracker = 0; else tracker += 1; the products
float * double, rounded to float). The optimizer steps are torch's own torch.optim.SGD.

Each step t: loss = sum(w * A_t) + sum(b * c_t) with given A_t, c_t (so the true gradients are A_t and c_t),
scaler.scale(loss).backward(), then at the listed steps one gradient element is overwritten with inf or NaN (as an
overflow in the backward would leave it), scaler.step(opt), scaler.update(). Recorded per step: the scale the loss
was scaled by, whether the optimizer step was skipped, the scale and growth tracker after update(), and w and b.
tests/test_grad_scaler.cpp replays it with mixtape's GradScaler and SGD (f32 within 1e-6 relative, f64 within
1e-12).

Format (tests/golden.h): {"torch", "script", "scaler", "cases": [...]}, each case
  {"name", "dtype", "init_scale", "growth_factor", "backoff_factor", "growth_interval", "lr", "momentum",
   "w0", "b0": tensors, "steps": [{"A", "c": tensors, "inject": null | {"param": "w", "index": [i, j],
   "value": "inf" | "nan"}, "scale_used", "skipped", "scale", "growth_tracker", "w", "b"}...],
   "state_dict": {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}}.

Run: python3 tests/golden/grad_scaler.py
"""
import json
import os
from collections import defaultdict
from enum import Enum

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


class OptState(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _refresh_per_optimizer_state():
    return {"stage": OptState.READY, "found_inf_per_device": {}}


class CpuGradScaler:
    """torch/cuda/amp/grad_scaler.py (1.13)'s GradScaler on CPU tensors (one device, so no _MultiDeviceReplicator)."""

    def __init__(self, init_scale=2.**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        assert growth_factor > 1.0, "The growth factor must be > 1.0."
        assert backoff_factor < 1.0, "The backoff factor must be < 1.0."
        self._init_scale = init_scale
        self._scale = None
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._init_growth_tracker = 0
        self._growth_tracker = None
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def _lazy_init_scale_growth_tracker(self, dev):
        self._scale = torch.full((1,), self._init_scale, dtype=torch.float32, device=dev)
        self._growth_tracker = torch.full((1,), self._init_growth_tracker, dtype=torch.int32, device=dev)

    def scale(self, outputs):
        if self._scale is None:
            self._lazy_init_scale_growth_tracker(outputs.device)
        return outputs * self._scale.to(device=outputs.device)

    def _unscale_grads_(self, optimizer, inv_scale, found_inf):
        # torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale), per grad: found_inf = 1 if
        # any element is inf/NaN; grad *= inv_scale (in the grad's opmath type).
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    if not torch.isfinite(param.grad).all():
                        found_inf.fill_(1.0)
                    param.grad.mul_(inv_scale)
        return {found_inf.device: found_inf}

    def unscale_(self, optimizer):
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        elif optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = self._scale.double().reciprocal().float()
        found_inf = torch.full((1,), 0.0, dtype=torch.float32, device=self._scale.device)
        optimizer_state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, found_inf)
        optimizer_state["stage"] = OptState.UNSCALED

    def _maybe_opt_step(self, optimizer, optimizer_state):
        retval = None
        if not sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
            retval = optimizer.step()
        return retval

    def step(self, optimizer):
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if optimizer_state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        assert len(optimizer_state["found_inf_per_device"]) > 0, "No inf checks were recorded for this optimizer."
        retval = self._maybe_opt_step(optimizer, optimizer_state)
        optimizer_state["stage"] = OptState.STEPPED
        return retval

    def update(self):
        found_infs = [found_inf for state in self._per_optimizer_states.values()
                      for found_inf in state["found_inf_per_device"].values()]
        assert len(found_infs) > 0, "No inf checks were recorded prior to update."
        found_inf_combined = found_infs[0]
        for i in range(1, len(found_infs)):
            found_inf_combined += found_infs[i]
        # torch._amp_update_scale_(scale, growth_tracker, found_inf_combined, growth, backoff, interval):
        if found_inf_combined.item():
            self._scale.fill_(self._scale.item() * self._backoff_factor)  # float * double, rounded to float
            self._growth_tracker.fill_(0)
        else:
            successful = self._growth_tracker.item() + 1
            if successful == self._growth_interval:
                new_scale = torch.tensor(self._scale.item() * self._growth_factor, dtype=torch.float32)
                if torch.isfinite(new_scale):
                    self._scale.fill_(new_scale.item())
                self._growth_tracker.fill_(0)
            else:
                self._growth_tracker.fill_(successful)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def get_scale(self):
        return self._init_scale if self._scale is None else self._scale.item()

    def state_dict(self):
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._init_growth_tracker if self._growth_tracker is None
                else self._growth_tracker.item()}


def tensor_json(t):
    t = t.detach().cpu()
    return {"shape": list(t.shape), "dtype": {torch.float32: "f32", torch.float64: "f64"}[t.dtype],
            "values": [float(v) for v in t.reshape(-1).tolist()]}


def run(name, dtype, seed, injects, init_scale=2.**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3,
        lr=0.1, momentum=0.9, steps=12):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn((4, 3), generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    b = torch.randn((3,), generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    case = {"name": name, "dtype": {torch.float32: "f32", torch.float64: "f64"}[dtype], "init_scale": init_scale,
            "growth_factor": growth_factor, "backoff_factor": backoff_factor, "growth_interval": growth_interval,
            "lr": lr, "momentum": momentum, "w0": tensor_json(w), "b0": tensor_json(b), "steps": []}
    opt = torch.optim.SGD([w, b], lr=lr, momentum=momentum)
    scaler = CpuGradScaler(init_scale, growth_factor, backoff_factor, growth_interval)
    for t in range(steps):
        A = torch.randn((4, 3), generator=gen, dtype=torch.float64).to(dtype)
        c = torch.randn((3,), generator=gen, dtype=torch.float64).to(dtype)
        opt.zero_grad()
        scale_used = scaler.get_scale()
        loss = (w * A).sum() + (b * c).sum()
        scaler.scale(loss).backward()
        inject = injects.get(t)
        if inject is not None:
            with torch.no_grad():
                w.grad[inject[0], inject[1]] = float(inject[2])
        stepped_before = [p.clone() for p in (w, b)]
        scaler.step(opt)
        skipped = all(torch.equal(p, q) for p, q in zip((w, b), stepped_before))
        scaler.update()
        case["steps"].append({
            "A": tensor_json(A), "c": tensor_json(c),
            "inject": None if inject is None else {"param": "w", "index": [inject[0], inject[1]],
                                                   "value": inject[2]},
            "scale_used": scale_used, "skipped": skipped, "scale": scaler.get_scale(),
            "growth_tracker": scaler._growth_tracker.item(), "w": tensor_json(w), "b": tensor_json(b)})
    case["state_dict"] = scaler.state_dict()
    return case


def main():
    # 12 steps, growth_interval 3: clean, clean, inf (backoff), 3 clean (growth), inf, NaN (two backoffs), 3 clean
    # (growth), clean.
    injects = {2: (0, 0, "inf"), 6: (1, 2, "-inf"), 7: (3, 1, "nan")}
    cases = [run("SGD momentum f32, infs at steps 2, 6, 7", torch.float32, 11, injects),
             run("SGD momentum f64, infs at steps 2, 6, 7", torch.float64, 12, injects)]
    out = {"torch": torch.__version__, "script": "grad_scaler.py",
           "scaler": "a CPU mirror of torch/cuda/amp/grad_scaler.py (torch 1.13 has no CPU GradScaler)",
           "cases": cases}
    with open(os.path.join(HERE, "grad_scaler.json"), "w") as f:  # one step a line
        head = json.dumps({k: v for k, v in out.items() if k != "cases"})[:-1]
        body = []
        for c in cases:
            steps = c.pop("steps")
            body.append(json.dumps(c)[:-1] + ', "steps": [\n' + ",\n".join(json.dumps(s) for s in steps) + "]}")
            c["steps"] = steps
        f.write(head + ', "cases": [\n' + ",\n".join(body) + "\n]}\n")
    for c in cases:
        print(c["name"], "scales:", [s["scale"] for s in c["steps"]], "skipped:",
              [i for i, s in enumerate(c["steps"]) if s["skipped"]])


if __name__ == "__main__":
    main()
