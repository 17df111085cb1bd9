"""benchmarks/kernels/bench_ring_wide.py's report on CPU: each cell is cuBLAS time / path time, the best ring config
is the fastest passing ``ring-*`` path (an unpadded comparison arm never counts), and paths that failed their check
are listed (the timing itself needs the GPU)."""

from tests.benchmarks.bench_module import load_bench

bench = load_bench("kernels/bench_ring_wide.py", "bench_ring_wide")  # its GPU-side imports are inside functions


def test_table_cells_and_failures():
    row = {"N": 18944, "K": 3584, "M": 128, "bf16_us": 60.0, "best": "ring-R64S3W2T128", "best_us": 48.0,
           "best_vs_bf16": 1.25,
           "paths": [{"path": "dispatch", "us": 75.0, "result": "PASS"}, {"path": "dense", "us": 120.0, "result": "PASS"},
                     {"path": "ring-R64S3W2T128", "us": 48.0, "result": "PASS"},
                     {"path": "ring-R64S3W4T256", "err": 0.5, "result": "FAIL"}]}
    text = bench.to_markdown({"info": {"gpu": "H", "date": "d"}, "points": [row]})
    assert "| 18944x3584 | 128 | 60.0 | 75.0 (0.80x) | 120.0 (0.50x) | 48.0 (1.25x), ring-R64S3W2T128 |" in text
    assert "(18944, 3584, 128, 'ring-R64S3W2T128'" not in text and "'ring-R64S3W4T256', 'FAIL')" in text


def test_rel_is_inf_on_nan():
    import torch

    assert bench.rel(torch.tensor([float("nan")]), torch.tensor([1.0], dtype=torch.float64)) == float("inf")
    assert bench.rel(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64)) == 0.0


def test_best_ring_skips_failures_and_the_unpadded_arm():
    paths = [{"path": "dispatch", "us": 10.0}, {"path": "ring-A", "us": 30.0}, {"path": "ring-B", "err": 1.0},
             {"path": "ring-A-unpadded", "us": 5.0}, {"path": "ring-C", "us": 20.0}]
    assert bench.best_ring(paths)["path"] == "ring-C"
    assert bench.best_ring([{"path": "dense", "us": 1.0}]) is None
