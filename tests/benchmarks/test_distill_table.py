"""benchmarks/distill_table.py: the job graph and the rendered table's claims, on hand-made rows."""

from benchmarks.distill_table import job_list, render


def _row(fmt, init, method, kl, source="sft", **kw):
    return {"format": fmt, "init": init, "method": method, "source": "-" if method == "PTQ" else source, "kl": kl,
            "ce": 3.0, "accuracy": 0.1, "kl_step0": None if method == "PTQ" else 1.0, **kw}


def test_every_source_job_waits_for_the_gptq_student_and_its_sequences():
    jobs = {j["name"]: j for j in job_list()}
    assert {"gptq-int3", "gptq-nvfp4", "rtn-int3", "rtn-nvfp4", "gen", "cal-int3"} <= set(jobs)
    student = "student-gptq-int3-g128.pt"
    assert jobs["src-teacher_correct"]["needs"] == [student, "seqs-teacher_correct.pt"]
    assert jobs["src-random"]["needs"] == [student] and not jobs["gptq-int3"]["needs"]


def test_claims_are_checked_against_the_rows_whichever_way_they_go():
    rows = [_row("int3-g128", "rtn", "PTQ", 1.5), _row("int3-g128", "rtn", "QAT", 1.1),
            _row("int3-g128", "rtn", "QAD", 0.7),
            _row("int3-g128", "gptq", "PTQ", 0.3), _row("int3-g128", "gptq", "QAT", 0.2),
            _row("int3-g128", "gptq", "QAD", 0.4),  # QAD worse than QAT here: the claim must say so
            _row("int3-g128", "gptq", "QAD", 0.8, source="random", train_sequences=256),
            _row("int3-g128", "gptq", "QAD", 0.35, scales="calibrated", lr=1e-3),
            {"format": "int3-g128", "init": "gptq", "source": "bos", "method": "QAD", "error": "skipped: deadline"},
            {"method": "teacher", "accuracy": 0.19}]
    md = render({"rows": rows, "meta": {"jobs": {"src-bos": {"rc": "killed at the deadline"}}, "wall_s": 200,
                                        "parallel": 6, "device": "cuda"}})
    assert "INT3 (g128/g64) RTN: KL(QAD) 0.700 < KL(QAT) 1.100 < KL(PTQ) 1.500: **holds**" in md
    assert "INT3 (g128/g64) GPTQ: KL(QAD) 0.400 < KL(QAT) 0.200 < KL(PTQ) 0.300: **does not hold**" in md
    assert "NVFP4 RTN: KL(QAD) < KL(QAT) < KL(PTQ): not measured" in md
    assert "random tokens vs sft text (INT3 (g128/g64), GPTQ): KL 0.800 vs 0.400 (+100%)" in md
    assert "GPTQ vs RTN init, INT3 (g128/g64) QAD: KL 0.400 vs 0.700: GPTQ **better**" in md
    assert "keeping GPTQ's grid (lr 0.001) vs recomputing the scales (lr ?): KL 0.350 vs 0.400" in md  # old rows
    assert "GPTQ's grid kept, lr 0.001" in md and "skipped: deadline" in md
    assert "src-bos (rc killed at the deadline)" in md and "teacher accuracy" not in md.lower().split("claims")[1]
