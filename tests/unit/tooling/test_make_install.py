"""``make test`` installs what this host can use: the gpu extra (TensorRT, NVML) where ``nvidia-smi`` lists a GPU,
so that GPU tests there skip only for want of a device, never for want of a package; the CPU extras elsewhere.
``make -n`` prints the install it would run, with a stand-in ``nvidia-smi`` for the host it pretends to be."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from support.paths import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _install_line(nvidia_smi: str) -> str:
    proc = subprocess.run(["make", "-n", "-B", "-C", str(REPO), "test", f"NVIDIA_SMI={nvidia_smi}"],
                          capture_output=True, text=True, timeout=60, check=True)
    return next(line for line in proc.stdout.splitlines() if "pip install -q -e" in line)


def test_a_gpu_host_installs_the_gpu_extra(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-0)"\n')
    smi.chmod(0o755)
    assert _install_line(str(smi)).endswith("-e '.[cpu,dev,gpu]'")


def test_a_host_without_a_gpu_installs_the_cpu_extras(tmp_path: Path) -> None:
    broken = tmp_path / "nvidia-smi"  # installed, but no driver or device answers it
    broken.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    broken.chmod(0o755)
    for smi in (str(tmp_path / "absent"), str(broken)):
        assert _install_line(smi).endswith("-e '.[cpu,dev]'")
