"""benchmarks/kernels/bench_fp8_gemv.py's report on CPU: the GB/s, HBM share and speed-ups it prints are the
documented arithmetic (the timing itself needs the GPU)."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "kernels"))
_spec = importlib.util.spec_from_file_location("bench_fp8_gemv", ROOT / "benchmarks" / "kernels" / "bench_fp8_gemv.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_table_arithmetic():
    res = {"gpu": "H", "torch": "t", "date": "d", "hbm_gbs": 3000.0,
           "rows": [{"shape": "q/o", "n": 4096, "k": 4096, "m": 1, "bytes": 15_000_000, "cublas_us": 15.0,
                     "bf16_us": 20.0, "default_us": 10.0, "best": "BN32s5w4v2", "best_us": 9.0, "max_rel_err": 1e-3}]}
    text = bench.table(res)  # 15 MB in 10 us = 1500 GB/s = 50 % of 3000
    assert "| q/o | 4096x4096 | 1 | 15.0 | 20.0 | 10.0 | 1500 | 50% | 1.50x | 2.00x | BN32s5w4v2 | 9.0 | 1.0e-03 |" in text
    assert set(bench.SHAPES) == {"q/o", "k/v", "gate/up", "down"}
