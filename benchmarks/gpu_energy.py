"""The GPU's energy and SM clock over a timed span, from NVML (through ctypes: no pynvml needed).

Why (session 34): the FP8 actor update runs at the H100's 700 W power cap -- and so do the BF16 arms (session 33's
nvidia-smi log: all three at 692-700 W, SM clock ~1.4-1.5 GHz). Were the step bound by energy there, a kernel made
faster without drawing less energy would only lend its time to the others' lower clock. Session 34 made the quantizers
slower (the same bytes) and the step lost their whole time -- the GPU then averaged ~674 W, below the cap; session 35
made them and the RoPE's copies faster (-0.6 ms a 7B layer alone) and the step did not move: the FP8 arm's power rose
to ~696 W and its GEMMs slowed by 0.47 ms (RESULTS.md "Session 35"). At the cap the J ratio is the ms ratio's bound;
the meter stays as the second measure beside each arm's milliseconds -- joules per layer, mean watts and SM clock.

``nvmlDeviceGetTotalEnergyConsumption`` counts mJ since the driver loaded (Volta and later); the clock is sampled
every ``period_s`` by a thread. The device is found by the CUDA device's UUID (CUDA and NVML number devices
differently). Where NVML or the counter is missing (CPU runs, other drivers) the meter reads ``None`` and ``why`` says
what failed (session 34's first GPU run read nothing, silently: it asked torch for a PCI bus id string it has not).
"""

from __future__ import annotations

import ctypes
import threading
import time

NVML_CLOCK_SM = 1


class EnergyMeter:
    """``start()`` / ``stop()`` around a span (after a device sync each); then ``joules``, ``seconds`` and
    ``sm_mhz`` (the mean of the sampled SM clock), each None where NVML gave nothing."""

    def __init__(self, device_index: int = 0, period_s: float = 0.05):
        self.lib = self.handle = None
        self.period_s = period_s
        self.joules = self.seconds = self.sm_mhz = None
        self.why = None
        try:
            import torch

            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if (rc := lib.nvmlInit_v2()) != 0:
                self.why = f"nvmlInit_v2 returned {rc}"
                return
            uuid = f"GPU-{torch.cuda.get_device_properties(device_index).uuid}"
            handle = ctypes.c_void_p()
            if (rc := lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle))) != 0:
                self.why = f"nvmlDeviceGetHandleByUUID({uuid}) returned {rc}"
                return
            self.lib, self.handle = lib, handle
            if self._energy_mj() is None:
                self.lib, self.why = None, "nvmlDeviceGetTotalEnergyConsumption failed (not supported here?)"
        except (OSError, AttributeError, RuntimeError, AssertionError) as e:
            self.why = f"{type(e).__name__}: {e}"

    def _energy_mj(self) -> int | None:
        v = ctypes.c_ulonglong()
        ok = self.lib is not None and self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(v)) == 0
        return v.value if ok else None

    def _sm_clock(self) -> int | None:
        v = ctypes.c_uint()
        ok = self.lib.nvmlDeviceGetClockInfo(self.handle, NVML_CLOCK_SM, ctypes.byref(v)) == 0
        return v.value if ok else None

    def _sample(self) -> None:
        while not self._done.wait(self.period_s):
            c = self._sm_clock()
            if c is not None:
                self._clocks.append(c)

    def start(self) -> None:
        self.joules = self.seconds = self.sm_mhz = None
        if self.lib is None:
            return
        self._clocks: list[int] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._e0, self._t0 = self._energy_mj(), time.perf_counter()
        self._thread.start()

    def stop(self) -> None:
        if self.lib is None:
            return
        e1, t1 = self._energy_mj(), time.perf_counter()
        self._done.set()
        self._thread.join()
        self.seconds = t1 - self._t0
        if e1 is not None and self._e0 is not None:
            self.joules = (e1 - self._e0) / 1e3
        if self._clocks:
            self.sm_mhz = sum(self._clocks) / len(self._clocks)
