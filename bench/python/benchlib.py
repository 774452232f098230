"""The one timing and recording helper of the Python benchmarks in bench/python/.

- time_us(fn, iters, warmup, cuda_device=None): median and minimum microseconds of fn() over
  `iters` runs after `warmup` runs. With a cuda device: CUDA events around each run (the GPU's
  time, as `mla bench` measures); without: time.perf_counter_ns around each run (host wall time).
- interleaved_us(fns, iters, warmup=3, rounds=10): (median, min) of each named host call, timed
  in `rounds` alternating blocks (a block of each call, then the next round), so that every call
  sees the same share of a shared machine's quiet and busy spells; host clock only.
- run_fields(device, commit=None): the fields every row carries: "date" (UTC, ISO 8601),
  "commit" (the argument, else $MLA_COMMIT, else "unknown"), "gpu" (the card as `mla bench`
  writes it: "NAME, N SMs, M GiB"; "cpu" on the cpu), "torch", "python".
- write_rows(rows, path=None): JSON lines with sorted keys, appended to path (stdout if None),
  the format of bench/results/*.jsonl.
"""
import datetime
import json
import os
import statistics
import sys
import time


def time_us(fn, iters, warmup=3, cuda_device=None):
    """(median, min) microseconds of fn() over iters runs after warmup runs."""
    if iters < 1:
        raise ValueError(f"time_us: iters must be at least 1, got {iters}")
    for _ in range(warmup):
        fn()
    samples = []
    if cuda_device is not None:
        import torch
        torch.cuda.synchronize(cuda_device)
        for _ in range(iters):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
    else:
        samples = _host_samples(fn, iters)
    return statistics.median(samples), min(samples)


def _host_samples(fn, iters):
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return samples


def interleaved_us(fns, iters, warmup=3, rounds=10):
    """{name: (median, min)} microseconds of each fn of fns ({name: fn}) over iters host-timed
    runs, after warmup runs of each, taken in `rounds` alternating blocks of iters // rounds."""
    if iters < rounds or rounds < 1:
        raise ValueError(f"interleaved_us: need iters >= rounds >= 1, got {iters}, {rounds}")
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name] += _host_samples(fn, iters // rounds)
    return {name: (statistics.median(v), min(v)) for name, v in samples.items()}


def card(device):
    """The device as `mla bench` names it in its rows' "gpu" field."""
    if getattr(device, "type", str(device)) != "cuda":
        return "cpu"
    import torch
    p = torch.cuda.get_device_properties(device)
    return f"{p.name}, {p.multi_processor_count} SMs, {p.total_memory >> 30} GiB"


def run_fields(device, commit=None):
    """date, commit, gpu, torch and python of one run (see the module's docstring)."""
    import torch
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit or os.environ.get("MLA_COMMIT") or "unknown",
        "gpu": card(device),
        "torch": torch.__version__,
        "python": ".".join(map(str, sys.version_info[:3])),
    }


def write_rows(rows, path=None):
    """Appends rows as JSON lines (sorted keys) to path, or writes them to stdout."""
    out = open(path, "a") if path else sys.stdout
    try:
        for row in rows:
            out.write(json.dumps(row, sort_keys=True) + "\n")
    finally:
        if path:
            out.close()
