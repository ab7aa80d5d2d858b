#!/usr/bin/env python3
"""tests/golden/lr_scheduler.py — PyTorch's learning-rate schedules, step by step, for tests/test_lr_scheduler.cpp.

Writes tests/golden/lr_scheduler.json (format: tests/golden.h). Each case drives an optimizer of two parameter
groups (lr 0.1 and 0.05) with one schedule and records, after construction (step 0) and after each of `steps`
calls of step(), the lr of every group and, where the schedule cycles it, the momentum (SGD's momentum, Adam's
beta1). The optimizer never steps: the schedules read and write only the groups' options. Run with Debian's
python3-torch (Debian's /usr/bin/python3): python3 tests/golden/lr_scheduler.py
"""
import json
import os
import warnings

import torch
from torch.optim import SGD, Adam
from torch.optim import lr_scheduler as S

warnings.filterwarnings("ignore")  # "lr_scheduler.step() before optimizer.step()": intended here


def optimizer(kind):
    a = torch.zeros(3, requires_grad=True)
    b = torch.zeros(2, requires_grad=True)
    groups = [{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.05}]
    if kind == "SGD":
        return SGD(groups, lr=0.1, momentum=0.9)
    return Adam(groups, lr=0.1, betas=(0.9, 0.999))


def momentum(opt):
    if isinstance(opt, Adam):
        return [g["betas"][0] for g in opt.param_groups]
    return [g["momentum"] for g in opt.param_groups]


CASES = [
    ("StepLR(3, 0.5)", "SGD", 12, lambda o: S.StepLR(o, 3, 0.5)),
    ("MultiStepLR([2, 5, 5, 9], 0.1)", "SGD", 12, lambda o: S.MultiStepLR(o, [2, 5, 5, 9], 0.1)),
    ("LinearLR(0.25, 1.0, 4)", "SGD", 8, lambda o: S.LinearLR(o, 0.25, 1.0, 4)),
    ("LinearLR(1.0, 0.1, 6)", "SGD", 8, lambda o: S.LinearLR(o, 1.0, 0.1, 6)),
    ("CosineAnnealingLR(6, 0.001)", "SGD", 20, lambda o: S.CosineAnnealingLR(o, 6, 0.001)),
    ("OneCycleLR(max_lr [1.0, 0.5], total_steps 20)", "SGD", 20,
     lambda o: S.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=20)),
    ("OneCycleLR(max_lr 0.3, total_steps 15, linear, three_phase)", "SGD", 15,
     lambda o: S.OneCycleLR(o, max_lr=0.3, total_steps=15, anneal_strategy="linear", three_phase=True)),
    ("OneCycleLR(max_lr 0.01, epochs 3, steps_per_epoch 4) on Adam", "Adam", 12,
     lambda o: S.OneCycleLR(o, max_lr=0.01, epochs=3, steps_per_epoch=4)),
    ("SequentialLR(LinearLR(0.1, 1.0, 5), CosineAnnealingLR(15), [5])", "SGD", 20,
     lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, 1.0, 5), S.CosineAnnealingLR(o, 15)], [5])),
    ("SequentialLR(StepLR(2, 0.5), MultiStepLR([1, 3], 0.1), [4])", "SGD", 10,
     lambda o: S.SequentialLR(o, [S.StepLR(o, 2, 0.5), S.MultiStepLR(o, [1, 3], 0.1)], [4])),
    # StepLR and LinearLR after a milestone: each restarts there through its closed form (step(0)).
    ("SequentialLR(LinearLR(0.5, 1.0, 2), StepLR(2, 0.5), LinearLR(0.25, 1.0, 3), [3, 8])", "SGD", 14,
     lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.5, 1.0, 2), S.StepLR(o, 2, 0.5), S.LinearLR(o, 0.25, 1.0, 3)],
                              [3, 8])),
]


def main():
    cases = []
    for name, kind, steps, make in CASES:
        opt = optimizer(kind)
        sched = make(opt)
        lrs, moms = [[g["lr"] for g in opt.param_groups]], [momentum(opt)]
        for _ in range(steps):
            sched.step()
            lrs.append([g["lr"] for g in opt.param_groups])
            moms.append(momentum(opt))
        cases.append({"name": name, "optimizer": kind, "steps": steps, "lr": lrs, "momentum": moms})
    out = {"torch": torch.__version__, "script": "lr_scheduler.py", "cases": cases}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lr_scheduler.json")
    with open(path + ".tmp", "w") as f:  # one line per case: small, and diffs show which case changed
        head = json.dumps({k: v for k, v in out.items() if k != "cases"})[:-1]
        f.write(head + ', "cases": [\n' + ",\n".join(json.dumps(c) for c in cases) + "\n]}\n")
    os.replace(path + ".tmp", path)
    print(f"wrote {path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
