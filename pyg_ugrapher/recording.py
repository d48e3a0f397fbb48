r"""Recorded training steps: a whole step captured once in a CUDA graph and replayed.

A training step on a graph of up to about a million edges is mostly host time: Python, the
dispatcher and kernel launches. Recorded with :class:`torch.cuda.CUDAGraph`, the same step is one
launch. :class:`RecordedStep` does it for a user's own step function (forward, loss, backward,
optimizer step), the way PyTorch's whole-network capture example does, and serves inputs of
several shapes with one recording per shape:

.. code-block:: python

    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, capturable=True)

    def train_step(x, edge_index, y, weight):
        optimizer.zero_grad(set_to_none=True)
        out = model(x, edge_index)
        loss = (F.cross_entropy(out, y, reduction="none") * weight).sum()
        loss.backward()
        optimizer.step()
        return loss.detach()

    step = ug.RecordedStep(train_step)
    for batch in loader:  # mini-batches: pad each to a few sizes
        padded = ug.pad_to_bucket(batch.x, batch.edge_index, batch.y, weight_of(batch))
        loss = step(*padded)

Mini-batches have a new size every step; :func:`pad_to_bucket` pads a batch graph to the next of
a few sizes (nodes and edges rounded up to the next step of a geometric series), so a handful of
recordings serve every batch. Padding follows PyG's :class:`~torch_geometric.transforms.Pad`: the
extra edges are self loops of the first padded node and the extra nodes have zero features, zero
labels and zero loss weight, so the real nodes' outputs, the loss and the gradients are those of
the unpadded batch (a padded node never sends a message to a real one).

What the step may do: anything CUDA graphs allow (no host synchronisation, no CPU tensors
created from GPU values, no data-dependent shapes). The step must read its inputs only through its
arguments: they are copied into the recording's own tensors before every replay.

Our layers meet this. A graph argument of up to
:data:`~autotune.selection.SMALL_GRAPH_EDGES` edges has its structures built inside the recording
(:func:`~pyg_ugrapher.graph_argument.built_in_recording`): every replay rebuilds them from the
edge index it was given, so one recording serves every batch of its sizes. Its indices are
checked inside the recording against the node counts the layers read them with in the warm-up
steps and clamped into range, so a wrong batch never makes a kernel read outside its tensors; the
next call raises ``ValueError``. A larger graph's structures are built once, before the recording,
which then serves that graph alone (a call with another graph raises ``ValueError``).
"""

from __future__ import annotations

import math
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from autotune.selection import SMALL_GRAPH_EDGES
from triton_kernels.index_bounds import clamp_edge_index_

from .graph_argument import (
    GraphBounds,
    graph_bounds_noted,
    graphs_read_while_capturing,
    holding_graphs,
    rebuilt_by_recordings,
)
from .structure import recording_steps, version

#: Default growth of the bucket series: a padded batch is at most this much larger than the batch.
BUCKET_GROWTH = 1.25
#: The smallest bucket (nodes or edges).
MIN_BUCKET = 64


def bucket(size: int, growth: float = BUCKET_GROWTH, minimum: int = MIN_BUCKET) -> int:
    r"""The smallest member of the series :math:`\lceil m \cdot g^k \rceil` (``m = minimum``,
    ``g = growth``, ``k = 0, 1, ...``) that is at least ``size``.

    Args:
        size (int): nodes or edges of a batch.
        growth (float): ratio of consecutive buckets (above 1).
        minimum (int): the first bucket.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size: expected a non-negative int, got {size!r}")
    if not isinstance(growth, (int, float)) or not math.isfinite(growth) or growth <= 1:
        raise ValueError(f"growth: expected a number above 1, got {growth!r}")
    if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 1:
        raise ValueError(f"minimum: expected a positive int, got {minimum!r}")
    value, step = minimum, 0
    while value < size:
        step += 1
        value = math.ceil(minimum * growth**step)
    return value


def pad_to_bucket(
    x: Tensor,
    edge_index: Tensor,
    *node_tensors: Tensor,
    growth: float = BUCKET_GROWTH,
    minimum: int = MIN_BUCKET,
) -> Tuple[Tensor, ...]:
    r"""``(x, edge_index, *node_tensors)`` padded to the bucket sizes of their nodes and edges.

    The number of nodes is padded to ``bucket(N + 1)`` (one padded node at least, which the
    padded edges loop on) and the number of edges to ``bucket(E)``. Padded node rows are zero;
    padded edges are ``(N, N)``, self loops of the first padded node (PyG's
    :class:`~torch_geometric.transforms.Pad`). The rows of the real nodes in a layer's output
    are those of the unpadded graph, for every layer whose messages follow the edges.

    Args:
        x (Tensor): ``[N, ...]`` node features.
        edge_index (Tensor): ``[2, E]`` edges between the ``N`` nodes.
        *node_tensors (Tensor): more ``[N, ...]`` tensors (labels, loss weights, masks), padded
            with zeros (``False``).
        growth (float): ratio of consecutive buckets.
        minimum (int): the smallest bucket.
    """
    if not isinstance(x, Tensor) or x.dim() < 1:
        raise TypeError(f"x: expected a tensor with a node dimension, got {type(x).__name__}")
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError("edge_index: expected a [2, E] tensor")
    if edge_index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"edge_index: expected int32 or int64 indices, got {edge_index.dtype}")
    num_nodes, num_edges = x.size(0), edge_index.size(1)
    for index, tensor in enumerate(node_tensors):
        if not isinstance(tensor, Tensor) or tensor.dim() < 1 or tensor.size(0) != num_nodes:
            raise ValueError(f"node_tensors[{index}]: expected a tensor of {num_nodes} rows (one per node of x)")
    nodes = bucket(num_nodes + 1, growth, minimum)
    edges = bucket(num_edges, growth, minimum)
    padded_edges = edge_index.new_full((2, edges), num_nodes)
    padded_edges[:, :num_edges] = edge_index
    return (_pad_rows(x, nodes), padded_edges, *(_pad_rows(t, nodes) for t in node_tensors))


def _pad_rows(tensor: Tensor, rows: int) -> Tensor:
    out = tensor.new_zeros((rows, *tensor.shape[1:]))
    out[: tensor.size(0)] = tensor
    return out


def _without_host_sync(step: Callable[..., object], inputs: Sequence[Tensor]) -> None:
    """Run ``step`` once, raising ``ValueError`` where it waits for the GPU: a capture would fail
    there, and a failed capture leaves the device's random number generator unusable."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(*inputs)
    except RuntimeError as error:
        if "synchroniz" not in str(error):
            raise
        raise ValueError(
            "step: it waits for the GPU (a host synchronisation: .item(), .tolist(), a boolean mask, "
            f"nonzero, a size read from a tensor) and cannot be recorded: {str(error).splitlines()[0]}"
        ) from error
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _clamp_indices(index: Tensor, bounds: Sequence[GraphBounds], flag: Tensor) -> None:
    """Clamp the rows of the edge index ``index`` in place into the ranges of ``bounds``, setting
    the int32 scalar ``flag`` where any index was out of range (no host sync)."""
    for check in bounds:
        clamp_edge_index_(index, check.src_row, check.num_src, check.num_dst, flag)


class _Recording:
    """One CUDA graph of the step, its input tensors and its outputs.

    ``fixed`` are the inputs our layers read cached graph structures of: the recording holds those
    structures, so these inputs must keep their values; ``seen`` remembers the caller's tensor
    last found equal for each. ``checked`` are the edge indices whose structures a recording can
    build itself (:func:`~pyg_ugrapher.graph_argument.rebuilt_by_recordings`), with the bounds the
    layers read them with. A first recording ``holds`` them too (its replays then build nothing);
    once one changes, the step is recorded again building them, and that recording checks and
    clamps them, setting the device flag ``seen_out_of_range`` where a replay finds an index out
    of range and copying it to the pinned ``out_of_range`` (read once ``replayed`` is done: no
    host sync)."""

    def __init__(
        self,
        inputs: List[Tensor],
        graph: torch.cuda.CUDAGraph,
        outputs: object,
        fixed: Sequence[int],
        checked: Dict[int, List[GraphBounds]],
        holds: bool,
        seen_out_of_range: Optional[Tensor],
        out_of_range: Optional[Tensor],
    ) -> None:
        self.inputs, self.graph, self.outputs = inputs, graph, outputs
        self.fixed = frozenset(fixed)
        self.checked, self.holds = checked, holds
        self.seen: Dict[int, Tuple[weakref.ref, object]] = {}
        # The recording reads and writes the flag: it must live as long as the recording.
        self.seen_out_of_range, self.out_of_range = seen_out_of_range, out_of_range
        self.replayed = torch.cuda.Event()

    def remember(self, index: int, tensor: Tensor) -> None:
        self.seen[index] = (weakref.ref(tensor), version(tensor))

    def holds_changed_graph(self, tensors: Sequence[Tensor]) -> bool:
        """Whether a held graph that the step can build itself changed (record again, building
        it); raise if a graph too large for that changed. Free for the tensors last checked,
        unchanged; one comparison each otherwise."""
        for index in self.fixed:
            tensor = tensors[index]
            ref, seen_version = self.seen.get(index, (None, None))
            if ref is not None and ref() is tensor and version(tensor) == seen_version:
                continue
            if torch.equal(self.inputs[index], tensor):
                self.remember(index, tensor)
            elif self.holds and index in self.checked:
                return True
            else:
                raise ValueError(
                    f"tensors[{index}]: a graph that differs from the one recorded. pyg_ugrapher's layers keep "
                    f"the structures of a graph of more than {SMALL_GRAPH_EDGES} edges (built once per graph, "
                    "with host synchronisations) outside the recording, so a recording serves one such graph; "
                    "record one RecordedStep per graph"
                )
        return False

    def check_indices(self) -> None:
        """Raise if a finished replay clamped an edge index that was out of range."""
        if self.out_of_range is not None and self.replayed.query() and bool(self.out_of_range):
            raise ValueError(
                "tensors: a replayed step had an edge index out of range of its nodes; the recording clamped "
                "it (no memory outside the tensors was read), so that step trained on a wrong graph. Check "
                "the batches given to this RecordedStep"
            )


class RecordedStep:
    r"""A training step recorded in a CUDA graph once per shape of its inputs, then replayed.

    Calling it with tensors copies them into the recording of their shapes (dtypes and devices)
    and replays it; the first call with new shapes runs ``warmup`` steps on a side stream (they
    are real steps: they train) and records one more. The return value is the recording's own
    output (the same tensors at every replay: clone what must be kept). On a CPU, or with
    ``enabled=False``, it calls ``step`` directly.

    Args:
        step (callable): ``step(*tensors)``, the whole training step; it reads its inputs only
            through its arguments and returns a tensor (or a tuple of tensors), the loss say.
        warmup (int): steps run before a recording (CUDA graphs need the allocator, the
            optimizer's state and every lazily built cache settled first).
        enabled (bool): record on CUDA devices (``False``: run eagerly, to compare).
        max_recordings (int): at most this many shapes are recorded; a call with another shape
            raises (a sign the inputs are not padded to buckets).
    """

    def __init__(
        self, step: Callable[..., object], warmup: int = 3, enabled: bool = True, max_recordings: int = 16
    ) -> None:
        if not callable(step):
            raise TypeError(f"step: expected a callable, got {type(step).__name__}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"warmup: expected a positive int, got {warmup!r}")
        if isinstance(max_recordings, bool) or not isinstance(max_recordings, int) or max_recordings < 1:
            raise ValueError(f"max_recordings: expected a positive int, got {max_recordings!r}")
        self.step, self.warmup, self.enabled, self.max_recordings = step, warmup, bool(enabled), max_recordings
        self._recordings: Dict[Tuple, _Recording] = {}
        self._pool: Optional[Tuple[int, int]] = None

    @property
    def num_recordings(self) -> int:
        """How many shapes have been recorded."""
        return len(self._recordings)

    def __call__(self, *tensors: Tensor) -> object:
        for index, tensor in enumerate(tensors):
            if not isinstance(tensor, Tensor):
                raise TypeError(f"tensors[{index}]: expected a torch.Tensor, got {type(tensor).__name__}")
        devices = {t.device.type for t in tensors}
        if not self.enabled or devices != {"cuda"}:
            return self.step(*tensors)
        home = tensors[0].device.index
        if home is not None and home != torch.cuda.current_device():
            # torch.cuda.graph captures the current device's work: record and replay on theirs.
            with torch.cuda.device(home):
                return self(*tensors)
        key = tuple((tuple(t.shape), t.dtype, t.device) for t in tensors)
        recording = self._recordings.get(key)
        if recording is None:
            if len(self._recordings) >= self.max_recordings:
                raise ValueError(
                    f"tensors: a {len(self._recordings) + 1}th shape ({[tuple(t.shape) for t in tensors]}) "
                    f"exceeds max_recordings={self.max_recordings}; pad the inputs to a few sizes (pad_to_bucket)"
                )
            return self._record(key, tensors)
        recording.check_indices()
        if recording.holds_changed_graph(tensors):
            return self._record(key, tensors, recording)
        for index, (static, tensor) in enumerate(zip(recording.inputs, tensors)):
            if index not in recording.fixed:
                static.copy_(tensor, non_blocking=True)
        recording.graph.replay()
        recording.replayed.record()
        return recording.outputs

    def _record(self, key: Tuple, tensors: Sequence[Tensor], held: Optional[_Recording] = None) -> object:
        """Record the step on ``tensors`` (:meth:`_record_step`), the layers running what is
        fastest on the device (:func:`~pyg_ugrapher.structure.recording_steps`): a replay pays
        no host time per operator."""
        with recording_steps():
            return self._record_step(key, tensors, held)

    def _record_step(self, key: Tuple, tensors: Sequence[Tensor], held: Optional[_Recording]) -> object:
        """Record the step on ``tensors``: after the warm-up steps, holding the structures of the
        graphs it reads; or, where the graphs of the recording ``held`` changed, building them
        (its warm-up already ran)."""
        inputs = [t.detach().clone() for t in tensors]
        device = inputs[0].device
        holds = held is None
        if holds:
            side = torch.cuda.Stream(device=device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side), graph_bounds_noted() as noted:
                for _ in range(self.warmup - 1):
                    self.step(*inputs)
                _without_host_sync(self.step, inputs)
            torch.cuda.current_stream(device).wait_stream(side)
            # The edge indices a recording can build the structures of, and the layers' bounds.
            checked = {
                index: list(dict.fromkeys(bounds for read, bounds in noted if read is static))
                for index, static in enumerate(inputs)
                if rebuilt_by_recordings(static)
            }
            checked = {index: bounds for index, bounds in checked.items() if bounds}
        else:
            checked = held.checked
            self._recordings.pop(key)
        seen_out_of_range = out_of_range = None
        if checked and not holds:
            out_of_range = torch.zeros((), dtype=torch.int32).pin_memory()
            seen_out_of_range = torch.zeros((), dtype=torch.int32, device=device)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # A stream of the inputs' device: torch.cuda.graph's default capture stream is one for the
        # whole process, made on whichever device was current at its first use.
        capture = torch.cuda.graph(graph, pool=self._pool, stream=torch.cuda.Stream(device=device))
        with holding_graphs(holds), graphs_read_while_capturing() as read, capture:
            if seen_out_of_range is not None:
                for index, bounds in checked.items():
                    _clamp_indices(inputs[index], bounds, seen_out_of_range)
                out_of_range.copy_(seen_out_of_range, non_blocking=True)
            outputs = self.step(*inputs)
        fixed = [index for index, static in enumerate(inputs) if any(static is other for other in read)]
        recording = _Recording(inputs, graph, outputs, fixed, checked, holds, seen_out_of_range, out_of_range)
        for index in fixed:
            recording.remember(index, tensors[index])
        self._recordings[key] = recording
        graph.replay()
        recording.replayed.record()
        return outputs
