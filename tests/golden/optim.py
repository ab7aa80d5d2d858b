#!/usr/bin/env python3
"""tests/golden/optim.py -> tests/golden/optim.json: 20 steps of torch.optim.SGD, Adam and AdamW from given weights
and given gradients.

Three parameters, (3, 4) in param group 0 and (5,), (2, 3) in param group 1 (which sets its own lr), start from
given weights; each step sets every parameter's .grad to the step's given gradient and calls optimizer.step().
Parameter 2 has no gradient at steps 3 and 7 (its .grad is None), so PyTorch skips it there and its step count,
and with it Adam's bias corrections, falls behind the others'. Every option set of the optimizers (SGD plain,
momentum, dampening, nesterov, weight_decay, maximize; Adam default, weight_decay, amsgrad, maximize; AdamW default,
amsgrad) runs in float32 and in float64, with the single-tensor implementation (foreach=False). Recorded: the
parameters after steps 1, 5 and 20, and the final state of each parameter (its number of updates and its buffers:
momentum_buffer, exp_avg, exp_avg_sq, max_exp_avg_sq). tests/test_optimizers.cpp replays every run with mixtape's
optimizers (f32 within 1e-6 relative, f64 within 1e-12).

Format (tests/golden.h): {"torch", "script", "cases": [...]}, one case per dtype
  {"name": "f32" | "f64", "dtype", "initial": [tensor per parameter], "grads": [[tensor or null per parameter]
   per step], "runs": [{"name", "optimizer": "SGD" | "Adam" | "AdamW", "options": {mixtape's option names: lr,
   momentum, dampening, weight_decay, nesterov, maximize | lr, beta1, beta2, eps, weight_decay, amsgrad, maximize;
   flags as 0/1}, "group1_lr", "after": {"1" | "5" | "20": [tensor per parameter]}, "state": [{"step": updates,
   buffer name: tensor...} per parameter]}]}.

Run: /usr/bin/python3 tests/golden/optim.py   (Debian's python3-torch; deterministic, no network)
"""
import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(3, 4), (5,), (2, 3)]
STEPS = 20
RECORD = (1, 5, 20)
NO_GRAD = {2: (3, 7)}  # parameter -> the steps at which it has no gradient
GROUP1_LR_FACTOR = 0.3

# name, optimizer, options (mixtape's names)
RUNS = [
    ("SGD plain", "SGD", {"lr": 0.1}),
    ("SGD momentum", "SGD", {"lr": 0.05, "momentum": 0.9}),
    ("SGD dampening", "SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.5}),
    ("SGD nesterov", "SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": 1}),
    ("SGD weight_decay", "SGD", {"lr": 0.05, "momentum": 0.8, "weight_decay": 0.01}),
    ("SGD maximize", "SGD", {"lr": 0.05, "momentum": 0.9, "maximize": 1}),
    ("Adam default", "Adam", {"lr": 0.01}),
    ("Adam weight_decay", "Adam", {"lr": 0.01, "weight_decay": 0.1}),
    ("Adam amsgrad", "Adam", {"lr": 0.01, "amsgrad": 1}),
    ("Adam maximize", "Adam", {"lr": 0.01, "beta1": 0.8, "beta2": 0.99, "maximize": 1}),
    ("AdamW default", "AdamW", {"lr": 0.01}),
    ("AdamW amsgrad", "AdamW", {"lr": 0.01, "weight_decay": 0.05, "amsgrad": 1}),
]


def tensor_json(t):
    t = t.detach().cpu()
    return {"shape": list(t.shape), "dtype": {torch.float32: "f32", torch.float64: "f64"}[t.dtype],
            "values": [float(v) for v in t.reshape(-1).tolist()]}


def torch_kwargs(optimizer, options):
    """mixtape's option names -> torch.optim's keyword arguments."""
    kw = {"foreach": False}
    for name, value in options.items():
        if name in ("nesterov", "maximize", "amsgrad"):
            kw[name] = bool(value)
        elif name not in ("beta1", "beta2"):
            kw[name] = value
    if optimizer in ("Adam", "AdamW"):
        kw["betas"] = (options.get("beta1", 0.9), options.get("beta2", 0.999))
    return kw


def run(optimizer, options, initial, grads):
    params = [w.clone().requires_grad_(True) for w in initial]
    kw = torch_kwargs(optimizer, options)
    groups = [{"params": params[:1]}, {"params": params[1:], "lr": kw["lr"] * GROUP1_LR_FACTOR}]
    opt = getattr(torch.optim, optimizer)(groups, **kw)
    after = {}
    updates = [0] * len(params)
    for step in range(1, STEPS + 1):
        for i, p in enumerate(params):
            g = grads[step - 1][i]
            p.grad = None if g is None else g.clone()
            updates[i] += g is not None
        opt.step()
        if step in RECORD:
            after[str(step)] = [tensor_json(p) for p in params]
    state = []
    for i, p in enumerate(params):
        s = {"step": updates[i]}
        for name in ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            t = opt.state[p].get(name)
            if t is not None:
                s[name] = tensor_json(t)
        if "step" in opt.state[p]:  # Adam's own count (a float tensor in 1.13) agrees with ours
            assert int(opt.state[p]["step"].item()) == updates[i]
        state.append(s)
    return after, state, groups[1]["lr"]


def main():
    cases = []
    for dtype, dname in ((torch.float32, "f32"), (torch.float64, "f64")):
        gen = torch.Generator().manual_seed(2024)
        initial = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in SHAPES]
        grads = []
        for step in range(1, STEPS + 1):
            row = []
            for i, s in enumerate(SHAPES):
                g = (torch.randn(s, generator=gen, dtype=torch.float64) * 0.5).to(dtype)
                row.append(None if step in NO_GRAD.get(i, ()) else g)
            grads.append(row)
        runs = []
        for name, optimizer, options in RUNS:
            after, state, group1_lr = run(optimizer, options, initial, grads)
            runs.append({"name": name, "optimizer": optimizer, "options": options, "group1_lr": group1_lr,
                         "after": after, "state": state})
        cases.append({"name": dname, "dtype": dname, "initial": [tensor_json(w) for w in initial],
                      "grads": [[None if g is None else tensor_json(g) for g in row] for row in grads],
                      "runs": runs})
    out = {"torch": torch.__version__, "script": "optim.py", "cases": cases}
    with open(os.path.join(HERE, "optim.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
