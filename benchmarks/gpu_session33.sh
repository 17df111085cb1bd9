#!/usr/bin/env bash
# Session 33. Issue 15 (Jet-RL): the 7B actor update is 1.47-1.49x BF16 + glue on the H100 (1.54x is the target;
# ~1 ms a layer missing). Session 32 prepared, and could not run, the down DGrad with SwiGLU's backward in its
# epilogue (quarl_kernels.fp8_dgrad_swiglu, opt-in QUARL_FP8_SWIGLU_DGRAD=1). Run from the repository root on the
# device machine; the record is at the end of this file.
#
#   phase a: bash benchmarks/gpu_session33.sh a   (nvidia-h100-x1; carry .dev/dg.tar.xz; ~9 min)
#     Session 32's prepared phase h, as written there: the fused DGrad's GPU tests, the kernel against DeepGEMM's
#     DGrad + the SwiGLU pass and each part alone, the MLP alone with it on / off, the 7B actor update off, on, off.
set -u
PHASE=${1:?phase}
OUT=${OUT:?}

case $PHASE in
a)
    exec bash benchmarks/gpu_session32.sh h
    ;;
esac

# ---------------------------------------------------------------------------------------------------------------
# Record (calls of this session; device time from the tool's lease):
