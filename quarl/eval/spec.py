"""The eval stage as a pipeline step: its inputs, output, run-form parameters and resources.

Declared once here; the component (components/eval/), its README and YAML and the
pipelines' ``eval_*`` parameters derive from it and from :class:`quarl.eval.config.EvalConfig`
(types and defaults). See :mod:`quarl.pipeline.stages`.
"""

from quarl.pipeline.stages import GPU, InputSpec, OutputSpec, Param, StageSpec

SPEC = StageSpec(
    name="eval",
    run="quarl.eval:run_eval",
    config="quarl.eval:EvalConfig",
    output=OutputSpec("results", "metrics", kfp_type="Artifact"),
    inputs=(
        InputSpec("model", "model", "model_uri", ref_param="base_model",
                  help="a model artifact (e.g. calibrate's quantized model); else base_model names it.",
                  ref_help='the model when no artifact is connected: HF id, "default", s3:// prefix.'),
        InputSpec("adapter", "adapter", "adapter_uri", optional=True,
                  help="a LoRA adapter artifact (e.g. from rl) applied on the model."),
        InputSpec("data", "dataset", "data_uris", optional=True, as_list=True,
                  help='a data_prep dataset; its eval split is the "heldout" benchmark.'),
    ),
    params={
        "benchmarks": Param("benchmarks", help='names or "name=path" (gsm8k, math500, aime24, aime25, amc23, '
                                               "heldout); empty = the data input."),
        "samples": Param("sampling.n", help="samples per problem (avg@n); 1 with greedy."),
        "temperature": Param("sampling.temperature", help="sampling temperature."),
        "top_p": Param("sampling.top_p", help="nucleus sampling."),
        "greedy": Param("sampling.greedy", help="argmax decoding."),
        "max_new_tokens": Param("sampling.max_new_tokens", help="response budget."),
        "quant": Param("quant", none="", help='RTN-quantize the loaded model to this format ("" = as loaded).'),
        "device": Param("device", help="auto | cpu | cuda | cuda:N."),
    },
    report_file="report.md",
    metrics=("benchmarks",),  # <name>.accuracy, .accuracy_stderr, .pass_at_k.<k>, .format_rate
    resources=GPU.with_(timeout_s=6 * 3600),
    description="Model (+ LoRA adapter) on math benchmarks: avg@n and unbiased pass@k, report with examples.",
    doc="Evaluate a model, optionally with a LoRA adapter, on math benchmarks: avg@n and unbiased pass@k.",
)
