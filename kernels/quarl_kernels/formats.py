"""Format ids shared by the Python side and the Triton kernels (no Triton import here)."""

FMT_NVFP4 = 0
FMT_MXFP4 = 1
FMT_INT4 = 2
FORMAT_IDS = {"nvfp4": FMT_NVFP4, "mxfp4": FMT_MXFP4, "int": FMT_INT4}
