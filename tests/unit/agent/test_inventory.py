"""Declared inventories parse into the same ``Device`` list NVML gives for the same hardware."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from support.nvml import NVMLError

from ember.wire import Device, NodeInfo, node_decoder
from ember_runtime.agent import inventory

NODE_A = """\
nvlink = [[0, 1]]

[host]
name = "node-a"
cpu_cores = 64
memory_gb = 512

[[gpu]]
model = "NVIDIA H100 80GB HBM3"
count = 2
numa_node = 0

[[gpu]]
model = "NVIDIA A10G"
memory_gb = 24
memory_used_gb = 2
utilization = 0.3
numa_node = 1

[[gpu]]
model = "NVIDIA A100-SXM4-80GB"
mig = { "1g.10gb" = 7 }
numa_node = 1
"""


def test_declared_inventory_lists_gpus_then_their_slices() -> None:
    devices = inventory.parse(NODE_A)
    assert [(d.index, d.name, d.memory_total_mb) for d in devices[:4]] == [
        (0, "NVIDIA H100 80GB HBM3", 81920), (1, "NVIDIA H100 80GB HBM3", 81920), (2, "NVIDIA A10G", 24576),
        (3, "NVIDIA A100-SXM4-80GB", 81920)]
    assert [d.uuid for d in devices[:4]] == ["GPU-node-a-0", "GPU-node-a-1", "GPU-node-a-2", "GPU-node-a-3"]
    slices = devices[4:]
    assert len(slices) == 7
    assert {(d.index, d.mig_profile, d.parent_uuid, d.memory_total_mb, d.numa_node) for d in slices} == {
        (3, "1g.10gb", "GPU-node-a-3", 10240, 1)}
    assert slices[0] == Device(kind="gpu", index=3, name="NVIDIA A100-SXM4-80GB MIG 1g.10gb", memory_total_mb=10240,
                               uuid="MIG-node-a-3-0", memory_free_mb=10240, mig_profile="1g.10gb",
                               parent_uuid="GPU-node-a-3", numa_node=1)


def test_declared_inventory_reports_topology_usage_and_mig_mode() -> None:
    h100, other, a10g, a100 = inventory.parse(NODE_A)[:4]
    assert (h100.nvlink_peers, other.nvlink_peers, a10g.nvlink_peers) == ([1], [0], [])
    assert (h100.numa_node, a10g.numa_node) == (0, 1)
    assert (a10g.memory_free_mb, a10g.utilization) == (22528, 0.3)
    assert (a100.mig_enabled, h100.mig_enabled) == (True, False)


def test_entry_nvlink_joins_its_gpus_and_groups_join_entries() -> None:
    text = 'nvlink = [[3, 4]]\n[[gpu]]\nmodel = "H100-80GB"\ncount = 4\nnvlink = true\n[[gpu]]\nmodel = "L4-24GB"\n'
    peers = [d.nvlink_peers for d in inventory.parse(text)]
    assert peers == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2, 4], [3]]


def test_memory_comes_from_the_model_name_when_not_given() -> None:
    (device,) = inventory.parse('[[gpu]]\nmodel = "A10G-24GB"\n')
    assert (device.name, device.memory_total_mb, device.memory_free_mb, device.uuid) == (
        "A10G-24GB", 24576, 24576, "GPU-virtual-0")


def test_an_inventory_without_gpus_is_its_cpu() -> None:
    (cpu,) = inventory.parse('[host]\ncpu_cores = 16\nmemory_gb = 64\ncpu_name = "EPYC"\n')
    assert cpu == Device(kind="cpu", index=0, name="EPYC (16 cores)", memory_total_mb=65536)


def test_load_reads_files_and_host_facts(tmp_path: Path) -> None:
    path = tmp_path / "node-a.toml"
    path.write_text(NODE_A)
    assert inventory.load(path) == inventory.parse(NODE_A)
    assert inventory.load_host(path) == inventory.HostInfo(cpu_cores=64, memory_mb=524288)


def test_load_without_a_file_falls_back_to_this_machine() -> None:
    devices = inventory.load(None)
    kinds = {d.kind for d in devices}
    assert kinds == {"gpu"} or [d.kind for d in devices] == ["cpu"]
    assert inventory.load_host(None).cpu_cores >= 1


def test_devices_survive_the_wire() -> None:
    info = NodeInfo(node_id="n", hostname="h", devices=inventory.parse(NODE_A), updated_at=1.0, cpu_cores=64,
                    memory_mb=524288, bundles=["ab" * 32])
    assert node_decoder.decode(msgspec.json.encode(info)) == info


def test_an_older_agent_s_devices_decode_with_defaults() -> None:
    old = {"node_id": "n", "hostname": "h", "updated_at": 1.0,
           "devices": [{"kind": "gpu", "index": 0, "name": "A10G", "memory_total_mb": 24576, "uuid": "GPU-1"}]}
    info = node_decoder.decode(msgspec.json.encode(old))
    (device,) = info.devices
    assert (device.memory_free_mb, device.mig_enabled, device.nvlink_peers, device.numa_node) == (None, False, [], -1)
    assert (info.cpu_cores, info.memory_mb, info.bundles) == (0, 0, [])


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "message"), [
    ('[[gpu]]\nmodel = "H100"\ncount = = 2\n', r"^inv\.toml:3: not valid TOML: .*line 3"),
    ('[[gpu]]\nmodel = "H100"\ncount = [2\n', r"^inv\.toml: not valid TOML: Unclosed array"),
    ('[host]\nname = "a"\n\n[[gpu]]\nmodel = "H100-80GB"\ncolour = "red"\n',
     r"^inv\.toml:6: gpu\[0\]\.colour: Object contains unknown field `colour`"),
    ('[[gpu]]\nmodel = "A-80GB"\n[[gpu]]\nmodel = "B-80GB"\ncount = "two"\n',
     r"^inv\.toml:5: gpu\[1\]\.count: Expected `int`, got `str`"),
    ('[[gpu]]\nmemory_gb = 80\n', r"^inv\.toml:1: gpu\[0\]: Object missing required field `model`"),
    ('[[gpu]]\nmodel = "Mystery"\n', r"^inv\.toml:1: gpu\[0\]\.memory_gb: missing, and the model name 'Mystery'"),
    ('[[gpu]]\nmodel = "A-80GB"\ncount = 0\n', r"^inv\.toml:3: gpu\[0\]\.count: must be from 1 to 64, got 0"),
    ('[[gpu]]\nmodel = "A-80GB"\nutilization = 30\n', r":3: gpu\[0\]\.utilization: is a share from 0 to 1"),
    ('[[gpu]]\nmodel = "A-24GB"\nmemory_used_gb = 30\n', r":3: gpu\[0\]\.memory_used_gb: must be from 0 to"),
    ('[[gpu]]\nmodel = "A-80GB"\nmig = { "1g.10" = 7 }\n', r":3: gpu\[0\]\.mig: '1g\.10' is not a MIG profile"),
    ('[[gpu]]\nmodel = "A-80GB"\nmig = { "1g.10gb" = 8 }\n', r":3: gpu\[0\]\.mig: .* 8 compute slices; a GPU has 7"),
    ('[[gpu]]\nmodel = "A-40GB"\nmig = { "3g.40gb" = 2 }\n', r":3: gpu\[0\]\.mig: the slices hold 80 GB; the GPU has"),
    ('nvlink = [[0, 2]]\n[[gpu]]\nmodel = "A-80GB"\ncount = 2\n',
     r"^inv\.toml:1: nvlink\[0\]: no GPU with index 2; the file declares indices 0 to 1"),
    ('nvlink = [[1, 1]]\n[[gpu]]\nmodel = "A-80GB"\ncount = 2\n', r":1: nvlink\[0\]: a group links at least two"),
    ('[host]\ncpu_cores = -1\n', r"^inv\.toml:2: host\.cpu_cores: must be >= 0"),
])
def test_invalid_inventories_say_where_and_what(text: str, message: str) -> None:
    with pytest.raises(inventory.InventoryError, match=message):
        inventory.parse(text, source="inv.toml")


# --- NVML ----------------------------------------------------------------------------------------


class FakeNvml:
    """The nvidia-ml-py calls ``from_nvml`` makes, answering for hardware described as plain data."""

    NVMLError = NVMLError
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 6
    NVML_NVLINK_DEVICE_TYPE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2

    def __init__(self, gpus: list[dict[str, Any]], *, driver: bool = True) -> None:
        self.gpus = gpus
        self.driver = driver
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        if not self.driver:
            raise NVMLError("Driver Not Loaded")
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> tuple[int, int]:
        return (i, -1)

    def _gpu(self, handle: tuple[int, int]) -> dict[str, Any]:
        return self.gpus[handle[0]]

    def nvmlDeviceGetName(self, h: tuple[int, int]) -> bytes:
        gpu = self._gpu(h)
        return (gpu["name"] if h[1] < 0 else f"{gpu['name']} MIG {gpu['mig'][h[1]]}").encode()

    def nvmlDeviceGetUUID(self, h: tuple[int, int]) -> str:
        return self._gpu(h)["uuid"] if h[1] < 0 else f"MIG-{self._gpu(h)['uuid'][4:]}-{h[1]}"

    def nvmlDeviceGetMemoryInfo(self, h: tuple[int, int]) -> SimpleNamespace:
        gpu = self._gpu(h)
        total = gpu["mb"] if h[1] < 0 else int(gpu["mig"][h[1]].split(".")[1][:-2]) * 1024
        used = gpu.get("used_mb", 0) if h[1] < 0 else 0
        return SimpleNamespace(total=total << 20, free=(total - used) << 20, used=used << 20)

    def nvmlDeviceGetUtilizationRates(self, h: tuple[int, int]) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._gpu(h).get("util", 0), memory=0)

    def nvmlDeviceGetMigMode(self, h: tuple[int, int]) -> list[int]:
        if "mig" not in self._gpu(h):
            raise NVMLError("Not Supported")
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: tuple[int, int]) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: tuple[int, int], j: int) -> tuple[int, int]:
        if j >= len(self._gpu(h)["mig"]):
            raise NVMLError("Not Found")
        return (h[0], j)

    def nvmlDeviceGetPciInfo(self, h: tuple[int, int]) -> SimpleNamespace:
        return SimpleNamespace(busId=f"00000000:{0x17 + h[0]:02X}:00.0".encode())

    def nvmlDeviceGetNvLinkState(self, h: tuple[int, int], link: int) -> int:
        links = self._gpu(h).get("links", [])
        if link >= len(links):
            raise NVMLError("Invalid Argument")
        return 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: tuple[int, int], link: int) -> int:
        return 2 if self._gpu(h)["links"][link] == "switch" else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: tuple[int, int], link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=f"0000:{0x17 + self._gpu(h)['links'][link]:02x}:00.0")

    def nvmlDeviceGetNumaNodeId(self, h: tuple[int, int]) -> int:
        return int(self._gpu(h)["numa"])


NODE_A_NVML = [
    {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-node-a-0", "mb": 81920, "links": [1, 1], "numa": 0},
    {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-node-a-1", "mb": 81920, "links": [0, 0], "numa": 0},
    {"name": "NVIDIA A10G", "uuid": "GPU-node-a-2", "mb": 24576, "used_mb": 2048, "util": 30, "numa": 1},
    {"name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-node-a-3", "mb": 81920, "numa": 1, "mig": ["1g.10gb"] * 7},
]


def test_a_declared_inventory_and_nvml_give_identical_devices() -> None:
    fake = FakeNvml(NODE_A_NVML)
    assert inventory.from_nvml(fake) == inventory.parse(NODE_A)
    assert fake.calls == ["init", "shutdown"]


def test_gpus_on_an_nvswitch_are_all_peers() -> None:
    gpus = [{"name": "H100", "uuid": f"GPU-{i}", "mb": 81920, "numa": i // 4, "links": ["switch"] * 3}
            for i in range(8)]
    devices = inventory.from_nvml(FakeNvml(gpus))
    assert [d.nvlink_peers for d in devices] == [[j for j in range(8) if j != i] for i in range(8)]


def test_no_driver_means_no_gpus() -> None:
    assert inventory.from_nvml(FakeNvml(NODE_A_NVML, driver=False)) == []


def test_an_nvml_failure_is_logged_and_yields_no_gpus(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml(NODE_A_NVML)
    fake.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(NVMLError("Unknown Error"))  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="ember.inventory"):
        assert inventory.from_nvml(fake) == []
    assert "Unknown Error" in caplog.text
    assert fake.calls == ["init", "shutdown"]
