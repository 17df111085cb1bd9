"""The precision_search stage as a pipeline step: inputs, output, run-form parameters, resources.

Declared once here; the component (components/precision_search/), its README and YAML and the
pipelines' ``precision_search_*`` parameters derive from it and from
:class:`quarl.search.config.PrecisionSearchConfig` (types and defaults). See :mod:`quarl.pipeline.stages`.
"""

from quarl.pipeline.stages import InputSpec, OutputSpec, Param, Resources, StageSpec

SPEC = StageSpec(
    name="precision_search",
    run="quarl.search:run_precision_search",
    config="quarl.search:PrecisionSearchConfig",
    output=OutputSpec("recipe", "recipe", kfp_type="Artifact"),
    inputs=(
        InputSpec("base", "model", "model_uri", ref_param="base_model",
                  help="the full-precision model as an artifact; else base_model names it.",
                  ref_help='the model to search: HF id, "default" (SmolLM2-135M-Instruct), s3:// prefix.'),
        InputSpec("data", "dataset", "data_uri", optional=True,
                  help="a data_prep dataset: its train split is the search batch, its eval split the held-out "
                       "batch."),
    ),
    params={
        "formats": Param("formats", help="the formats an agent may pick per unit (any quarl.quant format spec; "
                                         "bf16 = unchanged)."),
        "granularity": Param("granularity", help="one decision per fused projection (qkv, o, gate_up, down) | "
                                                 "block | group (attention / MLP) | linear."),
        "method": Param("method", help="how a chosen format is applied while searching: rtn | gptq (Hessians of "
                                       "the search batch)."),
        "budget_bits": Param("budget_bits", none=0.0, help="average storage bits per searched weight must stay <= "
                                                           "this (0 = budget_format decides)."),
        "budget_format": Param("budget_format", none="", help="without budget_bits: at most the average bits of "
                                                              "this format applied uniformly (empty = no budget)."),
        "episodes": Param("ppo.episodes", help="PPO episodes (= measured recipes; random search gets as many)."),
        "w_perf": Param("reward.w_perf", help="reward weight of the loss gap L_ref - L_quant."),
        "w_kl": Param("reward.w_kl", help="reward weight of -KL (its direction: kl)."),
        "kl": Param("reward.kl", help="ref_quant = KL(p_ref || p_quant), what calibrate and eval report | "
                                      "quant_ref = KL(p_quant || p_ref)."),
        "w_ent": Param("reward.w_ent", help="reward weight of the attention-entropy change E_quant - E_ref."),
        "w_mem": Param("reward.w_mem", help="reward weight of the memory saved vs BF16 (1 - avg_bits / 16)."),
        "device": Param("device", help="cpu | cuda | auto."),
    },
    report_file="report.md",
    metrics=("searched", "seconds.total", "evaluations.unique"),
    resources=Resources(image="cpu", cpu="4", memory="16Gi", timeout_s=6 * 3600),
    description="Per-layer weight formats chosen by a PPO agent under an average-bits budget -> a "
                "mixed-precision recipe for calibrate, with uniform/greedy/random baselines.",
    doc="Search each layer's weight format with a PPO agent under an average-bits budget; write a recipe for "
        "calibrate.",
)
