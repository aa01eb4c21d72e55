"""Fusion: named graph patterns that become single compiler ops (each a pass that can be switched off), and
greedy fusion of elementwise chains in the lowering."""
