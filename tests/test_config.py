"""quarl.config: YAML + overrides -> typed dataclasses, with errors that name the key and the fix."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from quarl.config import ConfigError, build_config, config_to_dict, dump_config, load_config


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


@dataclass
class Optim:
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: Literal["cosine", "constant"] = "cosine"


@dataclass
class Lora:
    rank: int = 16
    alpha: float = 32.0
    targets: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])


@dataclass
class Cfg:
    name: str = "run"
    steps: int = 100
    use_aqn: bool = False
    seed: int | None = None
    optim: Optim = field(default_factory=Optim)
    lora: Lora | None = field(default_factory=Lora)
    extra: dict[str, float] = field(default_factory=dict)
    out: Path = Path("runs")
    mode: Mode = Mode.TRAIN


@dataclass
class Needs:
    model: str
    batch: int = 8

    def __post_init__(self):
        if self.batch <= 0:
            raise ValueError(f"batch must be positive, got {self.batch}")


def test_defaults_without_file_or_overrides():
    assert load_config(Cfg) == Cfg()


def test_nested_yaml_then_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    # PyYAML reads `1e-5` (no dot) as a string; a float field must still get 1e-5.
    p.write_text("name: base\nsteps: 5\noptim:\n  lr: 1e-5\n  schedule: constant\nlora:\n  rank: 8\nmode: eval\n")
    cfg = load_config(
        Cfg,
        p,
        [
            "steps=1e3",
            "use_aqn=true",
            "lora.targets=[a, b]",
            "optim.betas=[0.8, 0.95]",
            "extra.kl=0.1",
            "name=0.10",
            "seed=7",
            "out=/tmp/x",
        ],
    )
    assert cfg.optim.lr == 1e-5 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.schedule == "constant"
    assert cfg.steps == 1000 and isinstance(cfg.steps, int)  # override wins over the file's 5
    assert cfg.use_aqn is True
    assert cfg.lora == Lora(rank=8, targets=["a", "b"])  # file's rank kept, alpha default kept
    assert cfg.optim.betas == (0.8, 0.95)
    assert cfg.extra == {"kl": 0.1}
    assert cfg.name == "0.10"  # typed text kept verbatim for a str field, not the float 0.1
    assert cfg.seed == 7 and cfg.out == Path("/tmp/x") and cfg.mode is Mode.EVAL


def test_override_to_null_and_optional_section():
    cfg = load_config(Cfg, None, ["seed=null", "lora=null", "optim.lr=3e-4"])
    assert cfg.seed is None and cfg.lora is None and cfg.optim.lr == pytest.approx(3e-4)


def test_unknown_keys_suggest_and_list_valid(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(Cfg, None, ["optim.lrr=1"])
    msg = str(e.value)
    assert "'optim.lrr'" in msg and "did you mean 'optim.lr'" in msg and "lr, betas, schedule" in msg
    p = tmp_path / "c.yaml"
    p.write_text("stpes: 3\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'stpes'.*did you mean 'steps'.*valid keys: name, steps"):
        load_config(Cfg, p)
    with pytest.raises(ConfigError, match="unknown config key 'zzz' for Cfg; valid keys"):
        load_config(Cfg, None, ["zzz=1"])


def test_keys_under_an_unknown_section_that_end_in_a_quarl_key():
    """verl-style dotted paths whose tail is one of quarl's keys name that key (any config, no table needed)."""
    with pytest.raises(ConfigError, match=r"'actor.optim.lr' for Cfg: did you mean 'optim.lr'\?"):
        load_config(Cfg, None, ["actor.optim.lr=1e-5"])
    with pytest.raises(ConfigError, match=r"'trainer.steps' for Cfg: did you mean 'steps'\?"):
        load_config(Cfg, None, ["trainer.steps=3"])


@pytest.mark.parametrize(
    ("override", "key", "origin"),
    [
        ("rollout.n=4", "rollout.group_size", "verl actor_rollout_ref.rollout.n"),
        ("num_generations=4", "rollout.group_size", "TRL num_generations"),
        ("optim.learning_rate=1e-6", "optim.lr", "TRL learning_rate"),
        ("actor_rollout_ref.actor.ppo_epochs=2", "algo.updates_per_rollout", "verl actor.ppo_epochs"),
        ("trainer.total_training_steps=3", "train.steps", "verl trainer.total_training_steps"),
        ("algorithm.kl_ctrl.kl_coef=0.01", "algo.beta", "verl algorithm.kl_ctrl.kl_coef"),
        ("lora.r=16", "policy.lora_r", "PEFT LoraConfig.r"),
    ],
)
def test_rl_names_from_trl_verl_peft_point_at_quarls_key(override, key, origin):
    from quarl.rl.config import RLConfig

    with pytest.raises(ConfigError) as e:
        build_config(RLConfig, None, [override])
    msg = str(e.value)
    assert f"quarl calls it {key!r}" in msg and origin in msg and f"set {key}=" in msg, msg


@pytest.mark.parametrize("stage", ["rl", "distill", "kd", "calibrate", "eval"])
def test_foreign_names_point_at_real_keys_and_shadow_none(stage):
    """Every FOREIGN_NAMES target is a key of its config; no foreign name is a field name anywhere in it (quarl's
    own names always win)."""
    import dataclasses
    import typing

    from quarl.calibrate.config import CalibrateConfig
    from quarl.distill.config import DistillConfig, KDColdStartConfig
    from quarl.eval.config import EvalConfig
    from quarl.rl.config import RLConfig

    root = {"rl": RLConfig, "distill": DistillConfig, "kd": KDColdStartConfig, "calibrate": CalibrateConfig,
            "eval": EvalConfig}[stage]

    def walk(c, path):
        hints = typing.get_type_hints(c)
        for f in dataclasses.fields(c):
            yield [*path, f.name]
            if dataclasses.is_dataclass(hints[f.name]):
                yield from walk(hints[f.name], [*path, f.name])

    paths = list(walk(root, []))
    keys, leaves = {".".join(p) for p in paths}, {p[-1] for p in paths}
    for name, (key, origin) in root.FOREIGN_NAMES.items():
        assert all(k.strip() in keys for k in key.split("/")), (name, key)
        assert name not in leaves, name
        assert origin


def test_a_field_of_one_section_given_at_the_top_names_its_section():
    from quarl.distill.config import DistillConfig

    with pytest.raises(ConfigError, match=r"'warmup_ratio' for DistillConfig: did you mean 'optim.warmup_ratio'\?"):
        build_config(DistillConfig, None, ["warmup_ratio=0.1"])
    with pytest.raises(ConfigError, match=r"'gradient_accumulation_steps'.*quarl calls it 'optim.batch_size'"):
        build_config(DistillConfig, None, ["gradient_accumulation_steps=4"])
    # a name several sections have is left to the plain error (valid keys listed)
    with pytest.raises(ConfigError, match=r"unknown config key 'dtype' for DistillConfig; valid keys"):
        build_config(DistillConfig, None, ["dtype=bfloat16"])


def test_calibrate_names_from_llm_compressor_and_gptq_point_at_quarls_key():
    from quarl.calibrate.config import CalibrateConfig

    with pytest.raises(ConfigError, match=r"'num_calibration_samples'.*quarl calls it 'data.num_samples'"):
        build_config(CalibrateConfig, None, ["num_calibration_samples=64"])
    with pytest.raises(ConfigError, match=r"'gptq.dampening_frac'.*quarl calls it 'gptq.percdamp'"):
        build_config(CalibrateConfig, None, ["gptq.dampening_frac=0.05"])


def test_a_valid_rl_override_is_untouched():
    from quarl.rl.config import RLConfig

    cfg = build_config(RLConfig, None, ["rollout.group_size=4", "optim.lr=2e-6"])
    assert cfg.rollout.group_size == 4 and cfg.optim.lr == 2e-6


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("steps=abc", r"'steps': expected int, got 'abc'"),
        ("steps=1.5", r"'steps': expected int, got 1.5"),
        ("steps=true", r"'steps': expected int, got True"),
        ("use_aqn=2", r"'use_aqn': expected bool, got 2"),
        ("optim.lr=fast", r"'optim.lr': expected float, got 'fast'"),
        ("optim.schedule=linear", r"'optim.schedule'.*allowed: 'cosine', 'constant'"),
        ("optim.betas=[0.9]", r"'optim.betas'.*expected 2 items"),
        ("lora.targets=q_proj", r"'lora.targets': expected list\[str\]"),
        ("lora.rank=[1]", r"'lora.rank': expected int"),
        ("extra.kl=high", r"'extra.kl': expected float"),
        ("mode=test", r"'mode'.*allowed: 'train', 'eval'"),
        ("optim=3", r"optim must be a mapping for Optim"),
        ("steps.sub=1", r"'steps': expected int, got \{'sub': 1\}"),
        ("steps", r"must look like key.sub=value"),
    ],
)
def test_type_errors_name_key_and_type(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(Cfg, None, [override])


def test_required_fields_and_post_init_validation():
    with pytest.raises(ConfigError, match="missing required config key"):
        load_config(Needs)
    assert load_config(Needs, None, ["model=tiny-llama"]) == Needs("tiny-llama")
    with pytest.raises(ConfigError, match="batch must be positive"):
        load_config(Needs, None, ["model=m", "batch=0"])


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Cfg, tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(Cfg, tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(Cfg, tmp_path / "bad.yaml")
    (tmp_path / "empty.yaml").write_text("")
    assert load_config(Cfg, tmp_path / "empty.yaml") == Cfg()


def test_dump_and_reload_round_trip(tmp_path):
    cfg = load_config(Cfg, None, ["steps=7", "optim.betas=[0.5, 0.6]", "mode=eval", "extra.x=2", "out=o/p"])
    d = config_to_dict(cfg)
    assert d["optim"]["betas"] == [0.5, 0.6] and d["mode"] == "eval" and d["out"] == "o/p"
    path = dump_config(cfg, tmp_path / "sub" / "resolved.yaml")
    assert load_config(Cfg, path) == cfg
