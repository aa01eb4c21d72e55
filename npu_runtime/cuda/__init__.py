"""The cuda backend (CuPy, NVRTC, cuBLAS). Importing it registers the backend; CuPy loads only when it is used."""

from .backend import CudaBackend, CudaBuffer, is_available

__all__ = ["CudaBackend", "CudaBuffer", "is_available"]
