"""bench/python/benchlib.py, the one timing / recording helper of the Python benchmarks, and
plan_bench.py on the cpu through it: median and minimum of real samples, the warm-up runs not
counted, rows with date, commit and card, JSON lines appended."""
import importlib.util
import json
import pathlib
import subprocess
import sys
import time

import pytest
import torch

_DIR = pathlib.Path(__file__).resolve().parents[2] / "bench" / "python"
_spec = importlib.util.spec_from_file_location("benchlib", _DIR / "benchlib.py")
benchlib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(benchlib)


def test_time_us_counts_iters_after_warmup_and_reports_median_and_min():
    calls = []
    sleeps = iter([0.0] * 2 + [0.020, 0.001, 0.005])  # 2 warm-up calls, then 3 timed

    def fn():
        calls.append(1)
        time.sleep(next(sleeps))

    med, mn = benchlib.time_us(fn, 3, warmup=2)
    assert len(calls) == 5
    assert 4900 <= med < 19000, med  # the middle sample: the 5 ms sleep
    assert 990 <= mn < 4900, mn      # the 1 ms sleep


def test_time_us_rejects_no_iterations():
    with pytest.raises(ValueError, match="iters must be at least 1, got 0"):
        benchlib.time_us(lambda: None, 0)


def test_interleaved_us_alternates_blocks_of_each_call():
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = benchlib.interleaved_us(fns, 4, warmup=1, rounds=2)
    assert order == ["a", "b"] + ["a", "a", "b", "b"] * 2  # warm-up, then two rounds
    assert set(times) == {"a", "b"} and all(0 <= mn <= med for med, mn in times.values())
    with pytest.raises(ValueError, match="need iters >= rounds >= 1, got 1, 2"):
        benchlib.interleaved_us(fns, 1, rounds=2)


def test_rows_carry_date_commit_card_and_append(tmp_path, monkeypatch):
    monkeypatch.setenv("MLA_COMMIT", "abc1234")
    row = benchlib.run_fields(torch.device("cpu"))
    assert row["commit"] == "abc1234" and row["gpu"] == "cpu"
    assert row["torch"] == torch.__version__
    assert len(row["date"]) == 20 and row["date"].endswith("Z")
    assert benchlib.run_fields(torch.device("cpu"), "given")["commit"] == "given"
    out = tmp_path / "rows.jsonl"
    benchlib.write_rows([{"b": 2, "a": 1}], str(out))
    benchlib.write_rows([dict(row, us=1.5)], str(out))
    lines = out.read_text().splitlines()
    assert lines[0] == '{"a": 1, "b": 2}'
    assert json.loads(lines[1])["us"] == 1.5 and json.loads(lines[1])["commit"] == "abc1234"


def test_plan_bench_rows_on_the_cpu():
    r = subprocess.run([sys.executable, str(_DIR / "plan_bench.py"), "--device", "cpu",
                        "--batch", "8", "--commit", "c0ffee0"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["what"] for x in rows] == ["absorbed_plan_op", "AbsorbedPlan.plan"]
    for x in rows:
        assert x["op"] == "python_plan" and x["b"] == 8 and x["commit"] == "c0ffee0"
        assert x["gpu"] == "cpu" and x["iters"] == 2000 and 0 < x["us_min"] <= x["us"]


def test_sglang_fp8_path_rows_on_the_cpu():
    # The benchmark of SGLang's flashinfer fp8 path beside mla's fp8 decode (issue 32), its
    # smallest shape on the cpu: every row of the four timings, each a real sample.
    r = subprocess.run([sys.executable, str(_DIR / "sglang_fp8_path.py"), "--device", "cpu",
                        "--quick", "--iters", "2", "--commit", "c0ffee0"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["what"] for x in rows] == ["sglang_flashinfer_fp8_path", "pool_to_bf16",
                                         "mla_fp8_decode", "mla_bf16_decode"]
    for x in rows:
        assert x["op"] == "sglang_fp8_path" and x["commit"] == "c0ffee0" and x["gpu"] == "cpu"
        assert x["pool_tokens"] >= 2 * x["b"] * x["s_k"] and 0 < x["us_min"] <= x["us"]
