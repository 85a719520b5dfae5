"""The node agent: discovers its GPUs, registers with the control plane and runs the work it is handed.

It imports `gpupool.protocol` and itself only (DESIGN.md §4.1); NVML is loaded lazily by
`gpupool.agent.devices.nvml`, so importing the agent never needs a GPU or the NVML binding.
"""
