"""The nodes' GPUs as metric families, under the names that DCGM's and Triton's dashboards use.

The node agents sample NVML (utilisation, memory) with each heartbeat and the GPU memory each replica's processes
use (every second); the control plane holds the last of each. Each figure is shown twice:

| figure | DCGM exporter name (unit) | Triton name (unit) |
| --- | --- | --- |
| utilisation | ``DCGM_FI_DEV_GPU_UTIL`` (%) | ``nv_gpu_utilization`` (0..1) |
| memory used | ``DCGM_FI_DEV_FB_USED`` (MiB) | ``nv_gpu_memory_used_bytes`` (bytes) |
| memory free | ``DCGM_FI_DEV_FB_FREE`` (MiB) | |
| memory total | | ``nv_gpu_memory_total_bytes`` (bytes) |
| the last Xid error | ``DCGM_FI_DEV_XID_ERRORS`` (its number; 0: none) | |

DCGM's labels are ``gpu`` (index), ``UUID``, ``modelName`` and ``Hostname``; Triton's ``gpu_uuid``. Both carry
``node`` (the Ember node id) too. A MIG slice is shown with its own uuid and its profile (``GPU_I_PROFILE``,
``mig_profile``). Ember's own: ``ember_gpu_memory_reserved_bytes`` (what the scheduler reserved for the replicas
assigned there), ``ember_replica_gpu_memory_used_bytes`` (per replica and device) and ``ember_gpu_out_of_service``
(1 for a device its node took out of service after a critical Xid error, see ``ember_runtime.agent.gpu_faults``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from ember.wire import DeviceView, NodeInfo, ReplicaStatus, StatusView

MIB = 1 << 20


def gpu_families(view: StatusView, nodes: Mapping[str, NodeInfo],
                 replicas: Iterable[ReplicaStatus]) -> Iterator[Metric]:
    dcgm = ["gpu", "UUID", "modelName", "Hostname", "GPU_I_PROFILE", "node"]
    triton = ["gpu_uuid", "mig_profile", "node"]
    util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilisation (in %), sampled by the node agent from NVML.",
                             labels=dcgm)
    used = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=dcgm)
    free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=dcgm)
    nv_util = GaugeMetricFamily("nv_gpu_utilization", "GPU utilisation rate (0.0 - 1.0).", labels=triton)
    nv_total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU total memory, in bytes.", labels=triton)
    nv_used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU used memory, in bytes.", labels=triton)
    xid = GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS", "The last Xid error the driver reported (0: none since the "
                            "node agent started).", labels=dcgm)
    out = GaugeMetricFamily("ember_gpu_out_of_service", "1 for a device out of service after a critical Xid error: "
                            "nothing is placed on it, and its replicas move.", labels=triton)
    reserved = GaugeMetricFamily("ember_gpu_memory_reserved_bytes",
                                 "GPU memory the scheduler reserved for the replicas assigned to a device.",
                                 labels=triton)
    for node in view.nodes:
        for d in _gpus(node.devices):
            dcgm_labels = [str(d.index), d.uuid, d.name, node.hostname, d.mig_profile, node.node_id]
            triton_labels = [d.uuid, d.mig_profile, node.node_id]
            util.add_metric(dcgm_labels, round(d.utilization * 100, 3))
            nv_util.add_metric(triton_labels, d.utilization)
            nv_total.add_metric(triton_labels, d.memory_total_mb * MIB)
            reserved.add_metric(triton_labels, d.memory_reserved_mb * MIB)
            xid.add_metric(dcgm_labels, d.xid)
            out.add_metric(triton_labels, 1 if d.fault else 0)
            if d.memory_free_mb is not None:
                used.add_metric(dcgm_labels, max(d.memory_total_mb - d.memory_free_mb, 0))
                free.add_metric(dcgm_labels, d.memory_free_mb)
                nv_used.add_metric(triton_labels, max(d.memory_total_mb - d.memory_free_mb, 0) * MIB)
    yield from (util, used, free, nv_util, nv_total, nv_used, reserved, xid, out)
    yield _replica_memory(nodes, replicas)


def _gpus(devices: Iterable[DeviceView]) -> Iterator[DeviceView]:
    return (d for d in devices if d.kind == "gpu" and d.uuid)


def _replica_memory(nodes: Mapping[str, NodeInfo], replicas: Iterable[ReplicaStatus]) -> GaugeMetricFamily:
    """What each replica's processes use on each of its devices, as its node last sampled it; only replicas
    still reporting (and so only those the reader may see, when ``replicas`` is filtered)."""
    family = GaugeMetricFamily("ember_replica_gpu_memory_used_bytes",
                               "GPU memory a replica's processes use on a device, sampled by its node agent.",
                               labels=["app", "service", "replica", "node", "gpu_uuid"])
    for r in replicas:
        node = nodes.get(r.node_id)
        for uuid, mb in sorted((node.replica_gpu_memory_mb.get(r.replica_id, {}) if node else {}).items()):
            family.add_metric([r.app, r.service, r.replica_id, r.node_id, uuid], mb * MIB)
    return family
