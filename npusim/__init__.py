"""npusim: the command-line front end of NPU Simulation (a thin layer over the compiler and the runtime)."""

__version__ = "0.1.0"
