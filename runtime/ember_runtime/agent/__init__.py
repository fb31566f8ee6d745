"""The node agent's process: slots that supervise replica processes, the bundle cache, the zygote pool, the
inventory (NVML or declared), NUMA and the GPU memory watch."""
