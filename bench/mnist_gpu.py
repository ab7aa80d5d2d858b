#!/usr/bin/env python3
"""bench/mnist_gpu.py — examples/mnist's models on one GPU, mixtape against PyTorch eager in the same run: one table.

For each model (mlp, cnn) and precision (fp32; fp16 by autocast and GradScaler; bf16 by autocast), the same initial
weights, data, batch size (128), optimizer (AdamW lr 1e-3) and epochs are trained by
  mixtape        bench_mnist_gpu (a child process; it writes the initial weights as safetensors first)
  pytorch        torch.autocast + torch.amp.GradScaler, torch.optim.AdamW with its defaults (foreach on CUDA)
  pytorch fused  the same with AdamW(fused=True)
  mixtape+graph  with --cuda-graph, mixtape again, one captured step replayed as a CUDA graph (bench_mnist_gpu)
  mixtape, columns <= N MiB  with --conv-column-limit-mib N (or N,M,...), the CNN again, its convolutions' im2col
                 columns held to N MiB instead of the default (10 in f16/bf16, 20 in f32; mixtape::cuda::
                 set_conv_column_limit); N = 0: "mixtape, whole batch", one GEMM a convolution, the most memory
  with --tf32, fp32 rows both ways on both sides: PyTorch's default runs convolutions in TF32 (cuDNN's
                 allow_tf32) and matrix products in f32, mixtape's everything in f32; "mixtape, tf32" (every f32
                 GEMM in TF32, mixtape::cuda::set_allow_tf32), "pytorch fused, tf32" (cudnn and matmul allow_tf32)
                 and, for the CNN, "pytorch fused, no tf32" (neither): like against like
each with the whole training set resident on the device (normalised once; a permutation per epoch drawn there,
batches gathered with index_select there) and timed alike (bench/mnist_gpu.cpp says how): steady-state step time,
samples/s, time per epoch, memory, final test accuracy. The ratio column is each row's step time over mixtape's eager
one (PyTorch's above 1: mixtape is faster).

Memory, beyond what the dataset holds, in two views that both frameworks count alike:
  peak       the most bytes tensors asked for at once during training (PyTorch's requested_bytes.all.peak, mixtape's
             peak_requested_bytes): the model's own footprint, whatever allocator serves it
  reserved   the most the caching allocator held from cudaMalloc (max_memory_reserved, peak_reserved_bytes): what the
             process really took from the device (mixtape rounds blocks above 1 MiB to 2 MiB and never splits them;
             PyTorch carves large tensors out of 20 MiB segments)
  held       what tensors still ask for after the last step (parameters, gradients, optimizer states)
  fwd keeps  what the forward under autocast leaves for backward (the second step): the activations the seeds'
             "activation memory about halved" is about, plus whatever else the tape saves (PyTorch keeps autocast's
             f16/bf16 copy of a weight whose layer's input needs a gradient; mixtape casts it again in backward)
The JSON lines also carry PyTorch's max_memory_allocated and mixtape's blocks (alloc_peak_mib).

The PyTorch side needs only what the lent GPU machine has (PyTorch; safetensors when importable, else the format's
few lines read here). --device cpu runs everything on the CPU to check the plumbing (PyTorch's CPU autocast has no
fp16 before 2.x, and fused AdamW is CUDA's: those rows are skipped with a note).

  python3 bench/mnist_gpu.py --build build --data data/mnist                     # every model and precision
  python3 bench/mnist_gpu.py --build build --models cnn --precisions fp16 --epochs 2 --json results.jsonl
  python3 bench/mnist_gpu.py --build build --models mlp --hidden 4096 --batch-size 1024   # the seeds' wide MLP
  python3 bench/mnist_gpu.py --build build --seeds 0,1,2,3,4                    # accuracy as a mean over seeds

One run's test accuracy after an epoch or two moves by a few tenths of a point with the seed (the initial weights
and the shuffle: on a CPU, six seeds of the MLP's first epoch gave 96.17-96.99% in mixtape and 96.34-96.90% in
PyTorch), so a comparison to a tenth of a point needs several seeds: with --seeds, every seed trains every row, the
table is the first seed's, and a second table gives each row's accuracy over the seeds (mean, smallest, largest).
"""
import statistics
import argparse
import gc
import contextlib
import gzip
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.1307, 0.3081


# ---- data and weights ------------------------------------------------------------------------------------------------

def read_idx(path):
    """An IDX file (raw or .gz) as a u8 tensor of its dimensions; the checks mixtape's reader makes, in short."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an IDX file of u8 values")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    body = data[4 + 4 * ndim:]
    count = 1
    for d in dims:
        count *= d
    if len(body) != count:
        raise ValueError(f"{path}: {len(body)} bytes of values, the header says {count}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


def find_file(directory, stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{directory}: no {stem} (raw or .gz)")


def load_split(directory, prefix, device):
    """Images (N, 1, 28, 28) f32 = (v/255 - mean)/std computed in double and rounded once (as mixtape's DataLoader),
    and labels (N) i64, on `device`."""
    images = read_idx(find_file(directory, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find_file(directory, f"{prefix}-labels-idx1-ubyte"))
    x = ((images.to(torch.float64) / 255.0 - MEAN) / STD).to(torch.float32).unsqueeze(1)
    return x.to(device), labels.to(torch.int64).to(device)


def load_safetensors(path):
    try:
        from safetensors.torch import load_file
        return load_file(path)
    except ImportError:  # the format: an 8-byte little-endian header length, a JSON header, the raw bytes
        with open(path, "rb") as f:
            data = f.read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64}
        out = {}
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            raw = bytearray(data[8 + n + begin:8 + n + end])
            out[key] = torch.frombuffer(raw, dtype=dtypes[entry["dtype"]]).reshape(entry["shape"]).clone()
        return out


# ---- the models: examples/mnist/models.h in torch.nn, parameters named alike -----------------------------------------

class Mlp(nn.Module):
    def __init__(self, hidden=512):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 10)

    def forward(self, x):
        h = F.relu(self.fc1(x.flatten(1)))
        h = F.relu(self.fc2(h))
        return self.fc3(h)


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

    def forward(self, x):
        h = F.relu(self.conv1(x))
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        h = self.dropout1(h).flatten(1)
        h = self.dropout2(F.relu(self.fc1(h)))
        return self.fc2(h)


def make_model(name, hidden, weights):
    model = Cnn() if name == "cnn" else Mlp(hidden)
    state = load_safetensors(weights)
    model.load_state_dict(state, strict=True)  # every key both ways, shapes checked
    return model


# ---- PyTorch's training, timed as bench_mnist_gpu times mixtape's ----------------------------------------------------

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device, dtype):
    """torch.autocast to `dtype`, or nothing for fp32."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def grad_scaler(device, enabled):
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device.type, enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)


def memory(device):
    """PyTorch's counts of `device` in bytes: tensors' requests (now and peak), blocks, reserved (now and peak).
    requested_bytes is PyTorch 2.1's; before it, memory_allocated (requests rounded to 512 bytes) stands in."""
    stats = torch.cuda.memory_stats(device)
    allocated, peak_allocated = torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)
    return {"requested": stats.get("requested_bytes.all.current", allocated),
            "peak_requested": stats.get("requested_bytes.all.peak", peak_allocated),
            "allocated": allocated, "peak_allocated": peak_allocated,
            "reserved": torch.cuda.memory_reserved(device), "peak_reserved": torch.cuda.max_memory_reserved(device)}


@contextlib.contextmanager
def pytorch_tf32(allow):
    """PyTorch's TF32 switches (cuDNN's convolutions, cuBLAS's matrix products) both set to `allow` for the block,
    restored after; None leaves PyTorch's defaults (convolutions in TF32, matrix products in f32)."""
    if allow is None:
        yield
        return
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = allow
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def train_pytorch(args, seed, model_name, precision, weights, fused, data, tf32=None):
    with pytorch_tf32(tf32):
        row = train_pytorch_rows(args, seed, model_name, precision, weights, fused, data)
    if tf32 is not None:
        row["framework"] += ", tf32" if tf32 else ", no tf32"
    return row


def train_pytorch_rows(args, seed, model_name, precision, weights, fused, data):
    device = torch.device(args.device)
    torch.manual_seed(seed)
    train_x, train_y, test_x, test_y = data
    sync(device)
    if device.type == "cuda":
        # The rows before this one left blocks in PyTorch's cache: without giving them back, this row's peak reserved
        # less its baseline was 0.0 wherever an earlier row had reserved as much (the fifth GPU run's table).
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        baseline = memory(device)
    model = make_model(model_name, args.hidden, weights).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **({"fused": True} if fused else {}))
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = grad_scaler(device, precision == "fp16")
    n = train_x.shape[0]
    epoch_steps = n // args.batch_size
    steps = min(epoch_steps, args.max_steps) if args.max_steps > 0 else epoch_steps
    warmup = min(args.warmup, steps - 1)
    generator = torch.Generator(device=device).manual_seed(seed)
    train_seconds, steady_seconds = 0.0, 0.0
    kept = None  # bytes the second step's forward kept (CUDA only)
    model.train()
    for epoch in range(args.epochs):
        epoch_start = time.perf_counter()
        perm = torch.randperm(n, device=device, generator=generator)
        for s in range(steps):
            if epoch == 0 and s == warmup:
                sync(device)
                steady_start = time.perf_counter()
            idx = perm[s * args.batch_size:(s + 1) * args.batch_size]
            x, y = train_x.index_select(0, idx), train_y.index_select(0, idx)
            optimizer.zero_grad(set_to_none=True)
            # What the forward keeps, counted in the second step (warm-up: torch.cuda.memory_stats builds a dict of
            # every statistic, too slow for a timed step).
            measure = device.type == "cuda" and epoch == 0 and s == 1
            before_forward = memory(device)["requested"] if measure else 0
            with autocast(device, amp_dtype):
                loss = F.cross_entropy(model(x), y)
            if measure:
                kept = memory(device)["requested"] - before_forward
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        sync(device)
        if epoch == 0:
            steady_seconds = time.perf_counter() - steady_start
        train_seconds += time.perf_counter() - epoch_start
    sizes = dict.fromkeys(["peak_mib", "held_mib", "kept_mib", "alloc_peak_mib", "reserved_peak_mib"])
    if device.type == "cuda":
        now = memory(device)
        sizes = {"peak_mib": (now["peak_requested"] - baseline["requested"]) / 2**20,
                 "held_mib": (now["requested"] - baseline["requested"]) / 2**20,
                 "kept_mib": None if kept is None else kept / 2**20,
                 "alloc_peak_mib": (now["peak_allocated"] - baseline["allocated"]) / 2**20,
                 "reserved_peak_mib": (now["peak_reserved"] - baseline["reserved"]) / 2**20}
    model.eval()
    hits = torch.zeros((), device=device)
    with torch.no_grad():
        for i in range(0, test_x.shape[0], 1000):
            with autocast(device, amp_dtype):
                logits = model(test_x[i:i + 1000])
            hits += (logits.argmax(1) == test_y[i:i + 1000]).sum()
    steady_steps = steps - warmup
    return {"framework": "pytorch fused" if fused else "pytorch", "model": model_label(args, model_name),
            "precision": precision,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "steps": steps * args.epochs, "step_ms": 1e3 * steady_seconds / steady_steps,
            "samples_per_s": steady_steps * args.batch_size / steady_seconds, "epoch_s": train_seconds / args.epochs,
            **sizes, "loss": loss.item(), "skipped": None,
            "accuracy": hits.item() / test_x.shape[0], "seed": seed, "torch": torch.__version__}


# ---- the run ---------------------------------------------------------------------------------------------------------

def model_label(args, model_name):
    return f"mlp{args.hidden}" if model_name == "mlp" and args.hidden != 512 else model_name


def run_mixtape(args, seed, model_name, precision, weights, graph=False, column_limit_mib=None, tf32=False):
    exe = os.path.join(args.build, "bench", "bench_mnist_gpu")
    cmd = [exe, "--model", model_name, "--hidden", str(args.hidden), "--precision", precision, "--device", args.device,
           "--data", args.data, "--weights-out", weights, "--epochs", str(args.epochs),
           "--batch-size", str(args.batch_size), "--warmup", str(args.warmup), "--max-steps", str(args.max_steps),
           "--seed", str(seed)] + (["--cuda-graph"] if graph else []) + \
          (["--conv-column-limit-mib", str(column_limit_mib)] if column_limit_mib is not None else []) + \
          (["--tf32"] if tf32 else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]), seed=seed)


def fmt(value, spec):
    return "—" if value is None else format(value, spec)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build", help="the CMake build directory holding bench/bench_mnist_gpu")
    parser.add_argument("--data", default=os.environ.get("MIXTAPE_MNIST_DIR", "data/mnist"),
                        help="the MNIST IDX directory [default: $MIXTAPE_MNIST_DIR, else data/mnist]")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--precisions", default="fp32,fp16,bf16")
    parser.add_argument("--hidden", type=int, default=512, help="the MLP's hidden width (examples/mnist: 512)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=50, help="first-epoch steps left out of the step time")
    parser.add_argument("--max-steps", type=int, default=0, help="steps per epoch at most (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="the initial weights' and the shuffle's seed")
    parser.add_argument("--seeds", help="comma-separated seeds, each training every row (overrides --seed)")
    parser.add_argument("--json", help="append every row as a JSON line to this file")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="also time mixtape replaying a captured step (a mixtape+graph row)")
    parser.add_argument("--conv-column-limit-mib", default="",
                        help="also train the CNN with mixtape's convolution columns held to this many MiB instead of "
                             "the default (10 in f16/bf16, 20 in f32), a row for each of a comma-separated list such "
                             "as 0,4,16 (mixtape::cuda::set_conv_column_limit; 'mixtape, columns <= N MiB' rows, "
                             "0: 'mixtape, whole batch')")
    parser.add_argument("--tf32", action="store_true",
                        help="fp32 rows also with TF32 on both sides ('mixtape, tf32', 'pytorch fused, tf32') and, "
                             "for the CNN, PyTorch without its default TF32 convolutions ('pytorch fused, no tf32')")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("mnist_gpu.py: --device cuda, but PyTorch sees no GPU (--device cpu checks the plumbing)")
    device = torch.device(args.device)
    data = load_split(args.data, "train", device) + load_split(args.data, "t10k", device)

    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    column_limits = [int(x) for x in args.conv_column_limit_mib.split(",") if x]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_mnist_gpu-") as tmp:
        for seed in seeds:
            for model_name in args.models.split(","):
                for precision in args.precisions.split(","):
                    weights = os.path.join(tmp, f"{model_name}.safetensors")
                    print(f"  seed {seed}, {model_name} {precision}: mixtape...", end="", file=sys.stderr, flush=True)
                    group = [run_mixtape(args, seed, model_name, precision, weights)]
                    if args.cuda_graph and args.device == "cuda":
                        print(" graph...", end="", file=sys.stderr, flush=True)
                        group.append(run_mixtape(args, seed, model_name, precision, weights, graph=True))
                    for limit in (column_limits if model_name == "cnn" else []):
                        print(f" columns <= {limit} MiB..." if limit else " whole batch...", end="", file=sys.stderr,
                              flush=True)
                        group.append(run_mixtape(args, seed, model_name, precision, weights, column_limit_mib=limit))
                    for fused in (False, True):
                        if device.type == "cpu" and (fused or precision == "fp16"):
                            continue  # fused AdamW is CUDA's; 1.x CPU autocast has no fp16
                        print(" pytorch" + (" fused" if fused else "") + "...", end="", file=sys.stderr, flush=True)
                        group.append(train_pytorch(args, seed, model_name, precision, weights, fused, data))
                    if args.tf32 and precision == "fp32" and device.type == "cuda":
                        print(" tf32: mixtape... pytorch...", end="", file=sys.stderr, flush=True)
                        group.append(run_mixtape(args, seed, model_name, precision, weights, tf32=True))
                        group.append(train_pytorch(args, seed, model_name, precision, weights, True, data, tf32=True))
                        if model_name == "cnn":  # the MLP's default PyTorch row is already all f32
                            group.append(train_pytorch(args, seed, model_name, precision, weights, True, data,
                                                       tf32=False))
                    print(" done", file=sys.stderr)
                    rows += group

    # The last column: each row's step time over mixtape's eager one (PyTorch rows above 1: mixtape is faster; the
    # mixtape+graph row below 1: the graph is faster than mixtape's eager steps).
    print(f"\nbench/mnist_gpu.py: {rows[0]['device']}, torch {torch.__version__}, batch {args.batch_size}, "
          f"AdamW lr 1e-3, {args.epochs} epoch(s), seed {seeds[0]}\n")
    print("| model | precision | framework | step ms | samples/s | s/epoch | peak MiB | reserved MiB | held MiB "
          "| fwd keeps MiB | test accuracy | skipped steps | step / mixtape's eager step |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    mixtape_step = {}
    for r in (r for r in rows if r["seed"] == seeds[0]):
        key = (r["model"], r["precision"])
        if r["framework"] == "mixtape":
            mixtape_step[key] = r["step_ms"]
        ratio = "" if r["framework"] == "mixtape" else f"{r['step_ms'] / mixtape_step[key]:.2f}x"
        print(f"| {r['model']} | {r['precision']} | {r['framework']} | {r['step_ms']:.3f} | {r['samples_per_s']:.0f} "
              f"| {r['epoch_s']:.2f} | {fmt(r['peak_mib'], '.1f')} | {fmt(r.get('reserved_peak_mib'), '.1f')} "
              f"| {fmt(r.get('held_mib'), '.1f')} | {fmt(r.get('kept_mib'), '.1f')} "
              f"| {100 * r['accuracy']:.2f}% "
              f"| {fmt(r['skipped'], 'd')} | {ratio} |")
    graphed = [r for r in rows if r["seed"] == seeds[0] and r.get("graph_nodes")]
    if graphed:
        # What an eager step's launches cost the host: the graph replays the same kernels without them.
        print("\nmixtape's eager step less its graph replay, per launch (the captured step's kernels and copies)\n")
        print("| model | precision | launches a step | eager - graph ms | us a launch |")
        print("|---|---|---:|---:|---:|")
        for r in graphed:
            extra = mixtape_step[(r["model"], r["precision"])] - r["step_ms"]
            print(f"| {r['model']} | {r['precision']} | {r['graph_nodes']} | {extra:.3f} "
                  f"| {1e3 * extra / r['graph_nodes']:.2f} |")
    if len(seeds) > 1:
        # Each row's test accuracy over the seeds, and mixtape's mean less each PyTorch row's.
        print(f"\nTest accuracy over seeds {','.join(map(str, seeds))}: mean (smallest - largest)\n")
        print("| model | precision | framework | mean | range | mixtape's mean less this row's |")
        print("|---|---|---|---:|---:|---:|")
        groups = {}
        for r in rows:
            groups.setdefault((r["model"], r["precision"], r["framework"]), []).append(100 * r["accuracy"])
        for (model, precision, framework), accs in groups.items():
            mean = statistics.fmean(accs)
            ours = statistics.fmean(groups[(model, precision, "mixtape")])
            delta = "" if framework.startswith("mixtape") else f"{ours - mean:+.2f}"
            print(f"| {model} | {precision} | {framework} | {mean:.2f}% | {min(accs):.2f}-{max(accs):.2f}% | {delta} |")
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
