"""Mixed-precision search: find a per-layer format recipe, then calibrate with it.

    data_prep -> precision_search -> calibrate (searched recipe) -> eval -> export

A PPO agent (quarl.search) picks each decoder block's weight format under an
average-bits budget, rewarded by the loss gap and KL to the full-precision model
on a fixed batch of the dataset's prompts; its output is a ``recipe`` artifact
that calibrate takes in place of a single format (a compressed-tensors
mixed-precision checkpoint), which eval scores and export ships.
"""

from quarl_pipelines._builder import PipelineDef, Step

PRECISION_SEARCH = PipelineDef(
    name="precision_search",
    description="PPO mixed-precision search under an average-bits budget, calibration with the searched recipe, "
                "eval, export",
    steps=(
        Step("data_prep"),
        Step("precision_search", inputs={"data": "data_prep.dataset"}),
        Step("calibrate", inputs={"recipe": "precision_search.recipe", "data": "data_prep.dataset"}),
        Step("eval", inputs={"model": "calibrate.model", "data": "data_prep.dataset"}),
        Step("export", inputs={"base": "calibrate.model"}),
    ),
)
