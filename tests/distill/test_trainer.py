"""The loop on a tiny model: it lowers the KL, resume reproduces the uninterrupted step exactly, QAT and
LoRA students re-quantize into their format, and a mismatched teacher is refused before any work."""

import json

import pytest
import torch

from quarl.distill.student import PairingError, build_student, check_pairing, finalize_student, to_qat
from quarl.distill.trainer import DistillTrainer
from quarl.quant import QuantLinear, quantize_model
from tests.distill.conftest import small_tiny_model, tiny_cfg, token_sequences


def _trainer(tmp_path, *extra, student=None):
    cfg = tiny_cfg(*extra)
    s, tok = student or small_tiny_model()
    t, _ = small_tiny_model()
    return DistillTrainer(cfg, s, t, tok, token_sequences(8), token_sequences(4, seed=9), tmp_path)


def _weights(model):
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


def test_qad_lowers_the_kl_and_logs_every_step(tmp_path):
    s, tok = small_tiny_model()
    t, _ = small_tiny_model()
    seqs = token_sequences(8)  # random tokens: the KL is measured on the sequences it trains on
    cfg = tiny_cfg("train.steps=6", "optim.lr=1e-4", "optim.batch_size=8", "optim.micro_batch_size=8",
                   "eval.every=3")
    tr = DistillTrainer(cfg, s, t, tok, seqs, seqs, tmp_path)
    res = tr.train()
    after = tr.evaluate()
    assert res["eval_before"]["kl"] > 0 and after["kl"] < 0.7 * res["eval_before"]["kl"]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6)) and "eval/kl" in rows[2] and "eval/kl" not in rows[0]
    assert rows[-1]["train/kl"] < rows[0]["train/kl"]


def _calibrated_student():
    model, tok = small_tiny_model()
    quantize_model(model, {"default": "nvfp4"})  # frozen packed layers, as a calibrate artifact loads
    return model, tok


@pytest.mark.parametrize("student", ["full-precision", "calibrated-grid"])
def test_resume_gives_the_identical_next_step(tmp_path, student):
    extra, make = ((), lambda: None) if student == "full-precision" else (("student.scales=calibrated",),
                                                                          _calibrated_student)
    full = _trainer(tmp_path / "a", *extra, student=make())
    full.train()
    part = _trainer(tmp_path / "b", *extra, student=make())
    part.train(stop_after=2)  # leaves a checkpoint at step 2
    resumed = _trainer(tmp_path / "b", *extra, student=make())
    res = resumed.train()
    assert res["start_step"] == 2 and res["end_step"] == 3
    wa, wb = _weights(full.model), _weights(resumed.model)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    la = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    lb = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    strip = [json.loads(x) for x in la], [json.loads(x) for x in lb]
    assert [r["loss"] for r in strip[0]] == [r["loss"] for r in strip[1]]


def test_ce_objective_needs_no_teacher_forward(tmp_path):
    tr = _trainer(tmp_path, "loss.objective=ce", "train.steps=1")
    calls = []
    tr.teacher.register_forward_hook(lambda *a: calls.append(1))
    tr.step(0)
    assert calls == []


def test_calibrated_student_starts_at_the_calibrated_point_and_requantizes():
    model, _ = small_tiny_model()
    quantize_model(model, {"default": "int4-g32"})  # stands in for a calibrate artifact (frozen packed layers)
    x = torch.randint(3, 2000, (1, 10))
    ref = model(input_ids=x).logits
    packed = {n: m.weight_packed.clone() for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert to_qat(model, "recompute") == len(packed)
    torch.testing.assert_close(model(input_ids=x).logits, ref, rtol=1e-4, atol=1e-4)  # RTN codes re-derived
    finalize_student(model)
    for n, m in model.named_modules():
        if isinstance(m, QuantLinear):
            assert m.mode == "frozen" and torch.equal(m.weight_packed, packed[n])


@pytest.mark.parametrize("spec", ["nvfp4", "int3-g32"])
def test_calibrated_scales_keep_a_gptq_grid_that_recomputed_scales_lose(spec):
    """GPTQ leaves some groups' extreme codes unused; scales=calibrated keeps its grid (step 0 and the
    re-quantized model are the GPTQ model exactly), scales=recompute re-derives a narrower grid."""
    import copy

    from quarl.calibrate.sequential import calibrate_model
    from quarl.quant import QuantRecipe
    from quarl.quant.model import plan_formats

    model, _ = small_tiny_model()
    g = torch.Generator().manual_seed(0)
    calibrate_model(model, plan_formats(model, QuantRecipe.load({"default": spec})),
                    [torch.randint(3, 2000, (2, 16), generator=g)], method="gptq", progress=False)
    x = torch.randint(3, 2000, (1, 10), generator=g)
    ref = model(input_ids=x).logits
    # values, not bytes: GPTQ's packer keeps a -0 code where re-quantizing writes +0 (the same number)
    vals = {n: m.qtensor().dequantize() for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    kept, moved = copy.deepcopy(model), copy.deepcopy(model)
    to_qat(kept, "calibrated")
    to_qat(moved, "recompute")
    assert torch.equal(kept(input_ids=x).logits, ref)
    finalize_student(kept)
    finalize_student(moved)
    layers = [(n, m, moved.get_submodule(n)) for n, m in kept.named_modules() if isinstance(m, QuantLinear)]
    assert all(torch.equal(a.qtensor().dequantize(), vals[n]) for n, a, _ in layers)
    assert any(not torch.equal(b.qtensor().dequantize(), vals[n]) for n, _, b in layers)


def test_calibrated_scales_refuse_a_format_without_them():
    model, _ = small_tiny_model()
    quantize_model(model, {"default": "mxfp4"})
    with pytest.raises(ValueError, match="student.scales=recompute"):
        to_qat(model, "calibrated")


@pytest.mark.parametrize("mode", ["qat", "lora"])
def test_student_modes_train_the_right_parameters(mode):
    model, _ = small_tiny_model()
    rep = build_student(model, tiny_cfg(f"student.mode={mode}").student)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if mode == "qat":
        assert names and all(n.endswith("proj.weight") for n in names)
    else:
        assert names and all("lora_" in n for n in names)
    assert rep["trainable_params"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.01)
    finalize_student(model)
    assert all(m.mode == "frozen" and m.lora_cfg is None and m.config is not None
               for m in model.modules() if isinstance(m, QuantLinear))
    assert not any(p.requires_grad for p in model.parameters())


def test_bad_pairing_is_refused():
    a, tok_a = small_tiny_model()
    b, tok_b = small_tiny_model(vocab=1024)
    with pytest.raises(PairingError, match="different vocabularies"):
        check_pairing(a, tok_a, b, tok_b)
    c, tok_c = small_tiny_model()
    tok_c.add_tokens(["<zzz-new-token>"])
    with pytest.raises(PairingError, match="tokenizers differ"):
        check_pairing(a, tok_a, c, tok_c)
    check_pairing(a, tok_a, c, tok_a)


def test_a_lora_student_held_through_each_step_trains_as_decoded_per_call(tmp_path, monkeypatch):
    """``optim.dequant_cache`` in the distill stage: a LoRA student's frozen base held through each step (the kernels
    stood in for by the reference decode on CPU, the device's memory by fixed numbers) gives the adapters the per-call
    run gives; every step logs what it held; a QAT student has nothing to hold."""
    from quarl.train.dequant_cache import base_bf16_bytes
    from tests.lora_stacks import FakeDeviceMemory, cpu_cache, stand_in_kernels

    served = []
    stand_in_kernels(monkeypatch, served)

    def run(setting, out):
        tr = _trainer(out, "train.steps=3", "student.mode=lora", "optim.lr=1e-3", f"optim.dequant_cache={setting}")
        if setting != "false":  # what __init__ finds on CUDA, and the device's counters
            tr.dequant_cache = cpu_cache(tr.model, setting, FakeDeviceMemory(2**40, 2**40, 0))
        tr.train()
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return _weights(tr.model), [r.get("dequant_cache/held_gb") for r in rows], tr

    off, held_off, _ = run("false", tmp_path / "off")
    assert not served
    on, held_on, tr = run("true", tmp_path / "on")
    assert served  # the held weights carried the student's projections
    assert held_off == [None] * 3 and held_on == [tr.dequant_cache.need / 2**30] * 3 and tr.dequant_cache.need > 0
    for k, v in off.items():
        torch.testing.assert_close(on[k], v, rtol=1e-5, atol=1e-6)
    qat = _trainer(tmp_path / "qat", "student.mode=qat")
    assert base_bf16_bytes(qat.model) == 0  # a QAT student trains its weights: nothing frozen to hold
    with pytest.raises(Exception, match="optim.dequant_cache must be auto"):
        tiny_cfg("optim.dequant_cache=often")
