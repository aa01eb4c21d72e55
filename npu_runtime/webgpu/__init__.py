"""The webgpu backend (wgpu-py: Metal, Vulkan, D3D12)."""
