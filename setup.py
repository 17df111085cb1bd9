"""Maps the user's top-level folders onto import names that clash with nothing on PyPI:

    quarl/                 -> quarl              (the library every stage calls)
    kernels/quarl_kernels  -> quarl_kernels      (Triton GPU kernels)
    components/            -> quarl_components   (KFP component wrappers)
    pipelines/             -> quarl_pipelines    (KFP DAGs and their compiled YAML)
"""

from setuptools import find_packages, setup

roots = {"quarl_kernels": "kernels/quarl_kernels", "quarl_components": "components", "quarl_pipelines": "pipelines"}
packages = find_packages(include=["quarl", "quarl.*"])
package_dir = {"quarl": "quarl"}
for name, path in roots.items():
    package_dir[name] = path
    packages += [name] + [f"{name}.{p}" for p in find_packages(where=path)]

setup(packages=packages, package_dir=package_dir, include_package_data=True,
      package_data={"quarl_components": ["*/*.yaml", "*/*.md"], "quarl_pipelines": ["*.yaml"], "quarl": ["recipes/*.yaml", "recipes/**/*.yaml"]})
