"""The hip backend: registered so that asking for it says why it cannot run (npusim has no HIP runtime)."""
