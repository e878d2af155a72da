"""What one format's Ray task asks the cluster for, and whether any node of it can ever give that.

GPUs: tensor x pipeline parallel size, when the cluster has GPUs (else one CPU). A vLLM-served format larger than
the largest node (harness.runtime.vllm.multinode) takes all of one node's GPUs but one: its server spreads over the
cluster through vLLM's Ray executor, which reserves its own tp x pp GPUs and needs one of them free on the node it
starts from (vllm/v1/executor/ray_utils.py, initialize_ray_cluster: "Current node has no GPU available").

Memory (Ray's `memory`, host RAM the scheduler sets aside for the task): the format's --memory-limit-gib where one
is set (the memory guard kills its worker there anyway), else the planned weights the chain holds in host memory at
once (the planners' estimate from the config, harness.capacity.weights_bytes): the 16-bit source model for the
baseline and every format quantized here (the quantizer loads it whole), a candidate checkpoint as it is stored. It
is a floor (activations, calibration and the Python process come on top), so that Ray does not place a 70B
format on a node with 32 GiB.

A request that no node meets is not submitted: Ray would keep it pending for ever on a cluster that does not grow.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.executors.base import ClusterInfo, ClusterNode
from harness.runtime.vllm.multinode import spans_nodes

GIB = 2**30


@dataclass(frozen=True)
class TaskRequest:
    gpus: int
    cpus: int
    memory_bytes: int | None
    memory_source: str  # "--memory-limit-gib", "planned: ...", or "" without a figure
    spans_nodes: bool = False  # served by vLLM across nodes (its own Ray placement group)

    def ray_options(self) -> dict:
        options: dict = {"num_gpus": self.gpus} if self.gpus else {"num_cpus": self.cpus}
        if self.memory_bytes:
            options["memory"] = self.memory_bytes
        return options

    def describe(self) -> str:
        bits = [f"{self.gpus} GPU(s)" if self.gpus else f"{self.cpus} CPU"]
        if self.memory_bytes:
            bits.append(f"{self.memory_bytes / GIB:.2f} GiB of memory ({self.memory_source})")
        return " and ".join(bits)


def task_request(inputs, fmt: str, cluster: ClusterInfo) -> TaskRequest:
    spec = inputs.spec
    parallel = spec.tensor_parallel_size * spec.pipeline_parallel_size
    node_gpus = cluster.gpus_per_node()
    spans = spec.backend == "vllm" and spans_nodes(spec.tensor_parallel_size, spec.pipeline_parallel_size, node_gpus)
    gpus = (node_gpus - 1 if spans else parallel) if node_gpus else 0
    limit = spec.memory_limit_bytes_for(fmt)
    if limit:
        memory, source = limit, "--memory-limit-gib"
    else:
        planned = planned_host_bytes(inputs, fmt)
        memory, source = planned if planned else (None, "")
    return TaskRequest(gpus, 1, memory, source, spans)


def planned_host_bytes(inputs, fmt: str) -> tuple[int, str] | None:
    """(bytes, where from): the weights the format's chain loads into host memory at once, estimated from the config
    as the serving plans estimate them; None where the planners cannot read the config."""
    from harness.capacity import weight_format, weights_bytes
    from harness.format_plans import shape_of, weight_format_of

    shape = shape_of(inputs)
    if shape is None:
        return None
    recipe = inputs.recipes.get(fmt)
    if recipe is not None and recipe.extra.get("external"):
        return weights_bytes(shape, weight_format_of(inputs, fmt)), "planned: the candidate checkpoint's weights"
    return weights_bytes(shape, weight_format("baseline")), "planned: the 16-bit source model's weights"


def unmet_reason(request: TaskRequest, cluster: ClusterInfo) -> str | None:
    """Why no live node of the cluster can run the task (None: one can, now or once it is free)."""
    if any(fits(request, node) for node in cluster.nodes):
        return None
    largest = ", ".join(f"{n.node}: {n.gpus:g} GPU, {n.cpus:g} CPU, {n.memory_bytes / GIB:.2f} GiB"
                        for n in sorted(cluster.nodes, key=lambda n: (n.gpus, n.memory_bytes), reverse=True)[:3])
    return (f"no node of the Ray cluster has room for its task: it needs {request.describe()} on one node; the "
            f"largest have {largest or 'no live node'}. Lower --memory-limit-gib or the parallel size, or add a "
            "node that large")


def fits(request: TaskRequest, node: ClusterNode) -> bool:
    return (node.gpus >= request.gpus and node.cpus >= request.cpus  # a GPU task takes Ray's default CPU too
            and node.memory_bytes >= (request.memory_bytes or 0))
