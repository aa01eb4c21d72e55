"""Small shared helpers for tests: export a torch module to an IR dict and run it through our stack."""

from __future__ import annotations

import numpy as np
import torch


def export_ir(module_factory, example_shapes_dtypes, name: str = "m") -> dict:
    """IR dict (dtype attrs stringified) of `module_factory()` exported on the meta device."""
    import torch_ir

    from npu_export.ir_io import ir_to_dict

    with torch.device("meta"):
        m = module_factory().eval()
        ins = tuple(torch.zeros(s, dtype=d) if d != torch.float32 else torch.randn(s) for s, d in example_shapes_dtypes)
    with torch.no_grad():
        ir = torch_ir.extract_ir(m, ins, model_name=name)
    return ir_to_dict(ir)


def state_dict_numpy(module: torch.nn.Module) -> dict[str, np.ndarray]:
    from npu_export.reference import to_numpy

    return {k: to_numpy(v) for k, v in {**module.state_dict(), **dict(module.named_buffers())}.items()}
