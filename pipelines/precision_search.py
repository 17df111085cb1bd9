"""Mixed-precision search: find a per-layer format recipe, then calibrate with it.

    data_prep -> precision_search -> calibrate (searched recipe) -> eval

The search scores per-layer sensitivity and picks formats under a memory budget;
its output is a ``recipe`` artifact that calibrate takes in place of a single
format. Declared now; builds once the ``precision_search`` stage exists.
"""

from quarl_pipelines._builder import PipelineDef, Step

PRECISION_SEARCH = PipelineDef(
    name="precision_search",
    description="Mixed-precision search under a memory budget, calibration with the searched recipe, eval",
    steps=(
        Step("data_prep"),
        Step("precision_search", inputs={"data": "data_prep.dataset"}),
        Step("calibrate", inputs={"recipe": "precision_search.recipe", "data": "data_prep.dataset"}),
        Step("eval", inputs={"model": "calibrate.model", "data": "data_prep.dataset"}),
    ),
)
