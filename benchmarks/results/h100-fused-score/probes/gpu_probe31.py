"""Probe 31: GAT's two heavy kernels, the cost model's schedule against a sample of the space.

On the layers suite's 4e6-edge graphs (heads 4 x 32 channels), for the forward output
(``x[u] * exp(score - l[v])`` summed per destination) and the backward's fused pass on the
reversed graph (``grad_x`` plus the per-edge products ``<x_u, G_v>``), each in two forms: the
score recomputed from the node halves (``leaky_relu(a_src[u] + a_dst[v])``) and read from a
materialised ``[E, H]`` logit tensor: the time of the chosen schedule and of 48 sampled ones.
Then four ways to compute ``t = (out * grad).sum(-1)``. Writes ``$OUT/probe31.txt`` and
``$OUT/probe31.csv``. Run from the repository root:
``python benchmarks/results/h100-fused-score/probes/gpu_probe31.py``.
"""
import os
import random
import sys

import pandas as pd
import torch
import triton
import triton.testing

sys.path.insert(0, os.getcwd())
import pyg_ugrapher as ug  # noqa: E402
import triton_kernels  # noqa: E402
from benchmarks.graphs import layer_graphs  # noqa: E402
from pyg_ugrapher import ops  # noqa: E402
from pyg_ugrapher.attention import GIVEN_LOGITS, _DOT_REVERSED, attention_ops  # noqa: E402
from pyg_ugrapher.nn.gat_conv import score_op  # noqa: E402

OUT = os.environ.get("OUT", ".")
text = open(os.path.join(OUT, "probe31.txt"), "w")
SAMPLE = int(os.environ.get("PROBE_SAMPLE", "48"))


def say(*args):
    line = " ".join(str(a) for a in args)
    print(line, flush=True)
    text.write(line + "\n")


def bench(fn):
    fn()
    return triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median")


cuda = torch.device("cuda")
H, C = 4, 32
score = score_op(("src_v", "dst_v"), "0.2")
recomputed = attention_ops(score.serialize(), False)
given = attention_ops(GIVEN_LOGITS.serialize(), False)
dot = ops._op(_DOT_REVERSED)
rows = []
for spec in layer_graphs():
    loaded = spec.load(cuda)
    graph = ug.GraphTensor.from_edge_index(loaded.edge_index, loaded.num_nodes)
    structure = graph.structure(cuda)
    reversed_ = ops.reversed_structure(structure)
    forward, backward = ops._arrays(structure), ops._arrays(reversed_)
    n = loaded.num_nodes
    gen = torch.Generator(device=cuda).manual_seed(0)
    x = torch.randn(n, H, C, device=cuda, generator=gen)
    grad = torch.randn(n, H, C, device=cuda, generator=gen)
    a_src, a_dst = (torch.randn(n, H, device=cuda, generator=gen) for _ in range(2))
    halves = [a_src.unsqueeze(-1), a_dst.unsqueeze(-1)]
    logits = ops.run_graph_op(structure, halves, ops.serialized(score), ops.AUTO)
    shift = ops.run_graph_op(structure, halves, ops.serialized(recomputed.shift), ops.AUTO)
    l = shift + ops.run_graph_op(structure, halves + [shift], ops.serialized(recomputed.denominator),
                                 ops.AUTO).log()
    cases = {
        "output/recomputed": (recomputed.output, forward, [x] + halves + [l], None),
        "output/given": (given.output, forward, [x, logits, l], None),
        "grad_x+dot/recomputed": (recomputed.grad_x, backward, [grad] + halves + [l], [x, grad]),
        "grad_x+dot/given": (given.grad_x, backward, [grad, logits, l], [x, grad]),
    }
    for name, (op, arrays, operands, message_operands) in cases.items():
        text_op = ops.serialized(op)
        info, layout, chosen, dtype = ops._decision(arrays.csr, operands, text_op, ops.AUTO)
        if message_operands is not None:
            message_layout = ops._layout_of(_DOT_REVERSED, message_operands)
            chosen = triton_kernels.pair_schedule(chosen, layout.message_width, message_layout.reduce_size)

        def runner(schedule):
            if message_operands is None:
                return lambda: triton_kernels.run(info, layout, arrays, operands, schedule, dtype)
            paired = triton_kernels.pair_schedule(schedule, layout.message_width, message_layout.reduce_size)
            return lambda: triton_kernels.run_with_edge_output(info, layout, dot, message_layout, arrays, operands,
                                                               message_operands, paired, (dtype, dtype))

        candidates = random.Random(0).sample(triton_kernels.space(info, layout.message_width), SAMPLE)
        timed = {}
        for schedule in [chosen] + candidates:
            if message_operands is not None and schedule.strategy == "edge":
                continue
            try:
                fn = runner(schedule)
                if fn() is None:  # a schedule that cannot write the edge output in the same pass
                    continue
                timed[schedule] = bench(fn)
            except Exception as error:  # noqa: BLE001
                say(f"  {name} {schedule}: failed {type(error).__name__}")
        best = min(timed, key=timed.get)
        say(f"{spec.name:14s} {name:24s} chosen {timed[chosen]:6.3f} ms ({chosen})  "
            f"best {timed[best]:6.3f} ms ({best})")
        for schedule, ms in sorted(timed.items(), key=lambda kv: kv[1])[:4]:
            say(f"      {ms:6.3f} ms  {schedule}")
        rows += [{"graph": spec.name, "case": name, "schedule": str(s), "chosen": s == chosen, "ms": ms}
                 for s, ms in timed.items()]
    out = torch.randn(n, H, C, device=cuda, generator=gen)
    ones = torch.ones(C, 1, device=cuda)
    variants = {
        "(out * grad).sum(-1)": lambda: (out * grad).sum(dim=-1),
        "einsum nhc,nhc->nh": lambda: torch.einsum("nhc,nhc->nh", out, grad),
        "linalg.vecdot": lambda: torch.linalg.vecdot(out, grad, dim=-1),
        "(out * grad) @ ones": lambda: ((out * grad).view(-1, C) @ ones).view(n, H),
        "bmm": lambda: torch.bmm(out.view(-1, 1, C), grad.view(-1, C, 1)).view(n, H),
    }
    expected = (out * grad).sum(dim=-1)
    for name, fn in variants.items():
        err = ((fn() - expected).abs().max() / expected.abs().max()).item()
        say(f"{spec.name:14s} t = {name:24s} {bench(fn):6.3f} ms  (max rel err {err:.1e})")
    del loaded, graph, structure
    torch.cuda.empty_cache()
pd.DataFrame(rows).to_csv(os.path.join(OUT, "probe31.csv"), index=False)
text.close()
