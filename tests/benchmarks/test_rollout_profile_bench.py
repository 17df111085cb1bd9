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


class _Ev:
    """A device event as ``by_name`` reads it."""

    def __init__(self, name, us):
        self.name = name
        self.time_range = type("T", (), {"elapsed_us": lambda _self, us=us: us})()


def test_kernels_by_name_per_step_and_what_no_op_claimed():
    """The graphed step's kernels by name (us and launches a step, the top by time), and the unattributed ones: the
    device events minus the kernels CPU ops claimed, name by name."""
    evs = [_Ev("_gemv_kernel", 10.0)] * 4 + [_Ev("epilogue_kernel", 2.0)] * 4 + [_Ev("norm", 1.0)] * 2
    top = bench.by_name(evs, steps=2)
    assert list(top) == ["_gemv_kernel", "epilogue_kernel", "norm"]
    assert top["_gemv_kernel"] == {"us": 20.0, "n": 2.0} and top["norm"] == {"us": 1.0, "n": 1.0}
    assert list(bench.by_name(evs, steps=2, top=1)) == ["_gemv_kernel"]
    left = bench.by_name(evs, 1, minus={"_gemv_kernel": {"us": 20.0, "n": 2}, "norm": {"us": 2.0, "n": 2}})
    assert left == {"_gemv_kernel": {"us": 20.0, "n": 2.0}, "epilogue_kernel": {"us": 8.0, "n": 4.0}}


def test_generate_check_differences_two_multi_token_calls(monkeypatch):
    """The real generate's step is the difference of two token counts (n // 4 and n), the fastest of the calls of
    each: a slow call of a length (here the first, +1 s) does not reach it, and neither does the prefill."""
    seen = []

    class Eng:
        def generate(self, rows, params, n, gen):
            seen.append(params.max_new_tokens)
            return params.max_new_tokens

    calls = {}

    def fake_time(fn):
        k = fn()
        calls[k] = calls.get(k, 0) + 1
        return k, 0.25 + 0.005 * (k - 1) + (1.0 if calls[k] == 1 else 0.0)  # prefill, 5 ms a token, slow first

    monkeypatch.setattr(bench.R, "_sync_time", fake_time)
    out = bench.generate_check(Eng(), [[1, 2]], 33, None, calls=2)
    assert out["generate_tokens"] == [8, 33] and abs(out["generate_step_ms"] - 5.0) < 1e-9
    assert seen == [8, 8, 8, 33, 33]  # a warm-up of the short length, then two calls of each
    with pytest.raises(ValueError, match="--check-tokens 2"):
        bench.generate_check(Eng(), [[1]], 2, None)
