"""The zoo's models made of torch.nn modules alone (no transformers class): a face detector's PReLU CNN (MTCNN's
proposal and refine nets), a recurrent sequence tagger, and PyTorch's own `nn.TransformerEncoder`. Tiny and random,
like the rest of the zoo (`npu_export.zoo`); each builder takes a seeded generator state from the caller."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

SEQ = 8
VOCAB = 64
STEPS = 4  # the recurrent model's sequence length: every step is a GEMM and a gate kernel of its own


class PReluCNN(nn.Module):
    """MTCNN's P-Net body and R-Net head: 3x3 convs each followed by a per-channel PReLU, max pooling with
    ceil_mode, a face/not-face softmax over channels and a box regression, then a flatten, a linear layer with a
    single shared PReLU weight and a second softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 10, 3), nn.PReLU(10)
        self.conv2, self.prelu2 = nn.Conv2d(10, 16, 3), nn.PReLU(16)
        self.conv3, self.prelu3 = nn.Conv2d(16, 32, 3), nn.PReLU(32)
        self.cls, self.box = nn.Conv2d(32, 2, 1), nn.Conv2d(32, 4, 1)
        self.fc, self.prelu4 = nn.Linear(32 * 3 * 3, 16), nn.PReLU()
        self.fc_cls = nn.Linear(16, 2)
        with torch.no_grad():  # PReLU slopes of both signs: every branch of the select matters
            for p in (self.prelu1, self.prelu2, self.prelu3, self.prelu4):
                p.weight.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor):
        x = F.max_pool2d(self.prelu1(self.conv1(x)), 2, 2, ceil_mode=True)
        x = self.prelu2(self.conv2(x))
        x = self.prelu3(self.conv3(x))
        probs = F.softmax(self.cls(x), dim=1)
        pooled = F.max_pool2d(x, 3, 2, ceil_mode=True)
        h = self.prelu4(self.fc(pooled.permute(0, 3, 2, 1).flatten(1)))
        return torch.cat([probs.flatten(1), self.box(x).flatten(1), F.softmax(self.fc_cls(h), dim=1)], dim=1)


class LSTMTagger(nn.Module):
    """Token ids -> embeddings -> a 2-layer bidirectional LSTM (batch first) -> per-token scores; the final hidden
    states go through a GRU cell, so both the sequence op and a cell appear."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.lstm = nn.LSTM(16, 24, num_layers=2, bidirectional=True, batch_first=True)
        self.cell = nn.GRUCell(48, 24)
        self.out = nn.Linear(48 + 24, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        y, (h, _) = self.lstm(self.emb(ids))
        # h is [layers * directions, batch, hidden] in eager, but torch 2.11's export traces it with an added unit
        # dim ([4, 1, batch, hidden]): viewed as eager's shape, h[-1] is the [batch, hidden] a GRUCell takes on every
        # torch
        h = h.reshape(-1, *h.shape[-2:])
        summary = self.cell(torch.cat([h[-2], h[-1]], dim=-1))
        return self.out(torch.cat([y, summary.unsqueeze(1).expand(-1, y.shape[1], -1)], dim=-1))


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class TorchTransformerEncoder(nn.Module):
    """`nn.TransformerEncoder` over token embeddings with a key padding mask (the op torch_ir keeps for its
    attention reshapes is `unflatten`), pre-norm layers and a final LayerNorm. The activation is a function of its
    own so that eager PyTorch runs the layers op by op, as the export does (with relu or gelu it takes its fused
    fast path in eval mode, whose bf16 rounding differs from the graph's by tens of ulps)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 64)
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True, norm_first=True,
                                           activation=_gelu_tanh)
        self.encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(64), enable_nested_tensor=False)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.emb(ids), src_key_padding_mask=mask == 0)


def prelu_cnn_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, 24, 24),)


def steps_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, VOCAB, (2, STEPS)),)


def ids_and_mask_inputs() -> tuple[torch.Tensor, ...]:
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    mask[0, -2:] = 0
    return (torch.randint(0, VOCAB, (1, SEQ)), mask)
