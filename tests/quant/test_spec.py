"""Format spec grammar (quarl.quant.spec): every documented form, round trips, and errors."""

import pytest

from quarl.quant.base import FormatConfig, QuantError, available_formats
from quarl.quant.formats.fp8 import FP8Config
from quarl.quant.formats.intk import IntConfig
from quarl.quant.formats.nf4 import NF4Config
from quarl.quant.spec import make_config, spec_string

CASES = [
    # spec, expected config, canonical spec_string
    ("int4", IntConfig(4, 128, False), "int4-g128"),
    ("int3-g64", IntConfig(3, 64, False), "int3-g64"),
    ("int8-sym", IntConfig(8, 128, True), "int8-g128-sym"),
    ("int2-g32-sym", IntConfig(2, 32, True), "int2-g32-sym"),
    ("w3g128", IntConfig(3, 128, False), "int3-g128"),
    ("w4g64", IntConfig(4, 64, False), "int4-g64"),
    ("nf4", NF4Config(), "nf4"),
    ("nf4-dq", NF4Config(double_quant=True), "nf4-dq"),
    ("nf4-b128", NF4Config(block_size=128), "nf4-b128"),
    ("nf4-dq-b32", NF4Config(block_size=32, double_quant=True), "nf4-dq-b32"),
    ("nf4-dq128", NF4Config(double_quant=True, dq_block_size=128), "nf4-dq128"),
    ("fp8", FP8Config("tensor"), "fp8"),
    ("fp8-tensor", FP8Config("tensor"), "fp8"),
    ("fp8-block", FP8Config("block"), "fp8-block"),
    ("fp8-blockwise", FP8Config("block"), "fp8-block"),
    ("fp8-block-b64", FP8Config("block", 64), "fp8-block-b64"),
    (" INT4-G128-SYM ", IntConfig(4, 128, True), "int4-g128-sym"),
    ("NF4-DQ", NF4Config(double_quant=True), "nf4-dq"),
]


@pytest.mark.parametrize("spec,cfg,canon", CASES)
def test_grammar_forms(spec, cfg, canon):
    got = make_config(spec)
    assert got == cfg and type(got) is type(cfg)
    assert spec_string(got) == canon
    assert make_config(canon) == cfg  # string round trip
    assert make_config(got.to_dict()) == cfg  # dict round trip


@pytest.mark.parametrize("spec", ["bf16", "none", "fp16", "fp32", "full", "BF16", None, {"format": "bf16"}])
def test_high_precision(spec):
    assert make_config(spec) is None
    assert spec_string(None) == "bf16"


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
def test_fp4_family(name):
    cfg = make_config(name)
    assert isinstance(cfg, FormatConfig) and cfg.name == name
    assert spec_string(cfg) == name and make_config(cfg.to_dict()) == cfg


def test_dict_and_instance_forms():
    assert make_config({"format": "int", "bits": 3, "group_size": 128}) == IntConfig(3, 128)
    assert make_config({"name": "nf4", "double_quant": True}) == NF4Config(double_quant=True)
    assert make_config({"format": "FP8", "granularity": "block"}) == FP8Config("block")
    cfg = IntConfig(8)
    assert make_config(cfg) is cfg
    assert set(available_formats()) >= {"nf4", "fp8", "int", "nvfp4", "mxfp4"}


@pytest.mark.parametrize(
    "spec,match",
    [
        ("int5", "bits=5 is not supported"),
        ("w5g128", "bits=5 is not supported"),
        ("int4-g0", "group_size must be positive"),
        ("nf4-b63", "even"),
        ("fp9", "unknown format spec 'fp9'"),
        ("int4-sym-g128", "unknown format spec"),  # options come in grammar order
        ("nf4-b64-dq", "unknown format spec"),
        ("", "unknown format spec"),
        ({"format": "int", "bitz": 4}, "bad options for format 'int'"),
        ({"format": "fp8", "granularity": "channel"}, "granularity 'channel'"),
        ({"format": "nope"}, "unknown quantization format 'nope'"),
        (4, "must be a string or a dict"),
    ],
)
def test_bad_specs(spec, match):
    with pytest.raises(QuantError, match=match):
        make_config(spec)


def test_unknown_spec_message_lists_the_grammar():
    with pytest.raises(QuantError) as e:
        make_config("int4g128")
    msg = str(e.value)
    assert "w<bits>g<group>" in msg and "fp8-block" in msg and "nvfp4" in msg
