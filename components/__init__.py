"""quarl's Kubeflow components: one per stage, each a thin typed wrapper over the library.

    from quarl_components import COMPONENTS
    COMPONENTS["calibrate"]          # a kfp component; compiled copy in components/calibrate/component.yaml

Adding a stage: a ``StageSpec`` in ``quarl/pipeline/stages.py``, a folder here with
its ``component.py`` (signature + one call, see ``_base.py``), and one line below.
"""

from quarl_components.calibrate import calibrate
from quarl_components.data_prep import data_prep
from quarl_components.eval import eval
from quarl_components.export import export
from quarl_components.precision_search import precision_search
from quarl_components.rl import rl

COMPONENTS = {
    "data_prep": data_prep,
    "precision_search": precision_search,
    "calibrate": calibrate,
    "rl": rl,
    "eval": eval,
    "export": export,
}

__all__ = ["COMPONENTS"]
