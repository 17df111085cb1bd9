"""benchmarks/rollout_profile.py's variant parser on CPU: every ``:modifier`` names the engine switch it sets (the
before / after of a change, e.g. ``:nopdl`` for programmatic dependent launch), the module docstring documents each
one, modifiers combine, and an unknown modifier or recipe stops the run naming the known ones."""

import pytest

from tests.benchmarks.bench_module import load_bench

bench = load_bench("rollout_profile.py", "rollout_profile")


def test_every_modifier_is_documented():
    missing = [m for m in bench.MODIFIERS if f"``:{m}``" not in bench.__doc__]
    assert not missing, f"modifiers without a line in the module docstring: {missing}"


def test_modifiers_set_their_switches_and_combine():
    recipe, fp32, pack, env = bench.parse_variant("nvfp4+lora32:nopdl:noring")
    assert (recipe, fp32, pack) == ("nvfp4+lora", True, True)
    assert env == (("QUARL_KERNELS_PDL", "0"), ("QUARL_KERNELS_WGMMA_RING", "0"))
    assert bench.parse_variant("nvfp4+lora32:earlypdl")[3] == (("QUARL_KERNELS_PDL", "early"),)
    assert bench.parse_variant("bf16+lora:nopack")[2:] == (False, ())


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(SystemExit, match="unknown modifier.*'nope'.*known: nopack"):
        bench.parse_variant("nvfp4+lora32:nope")
    with pytest.raises(SystemExit, match="unknown recipe 'int3'"):
        bench.parse_variant("int3")


def test_rowmajor_switches_the_blocked_layout_off():
    """``:rowmajor`` (the packed words as before session 21) sets the engine's layout switch to row-major."""
    from quarl.quant import packed_layout

    assert bench.parse_variant("nvfp4+lora32:rowmajor")[3] == ((packed_layout.ENV, "0"),)
