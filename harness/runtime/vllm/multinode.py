"""vLLM beyond one node: a format whose tensor x pipeline parallel size exceeds the GPUs of one node of the Ray
cluster the run uses (--executor ray) is served with vLLM's Ray distributed executor, `--distributed-executor-backend
ray` (vllm/config/parallel.py, DistributedExecutorBackend; without it vLLM 0.32 refuses: "World size (N) is larger
than the number of available GPUs (M) in this node ... set '--distributed-executor-backend ray'"). The server joins
the same cluster (RAY_ADDRESS) and reserves its tp x pp GPUs there in a placement group of its own.

The Ray executor tells the format's chain, on whichever node it runs, about the cluster through two environment
variables of its task (NODE_GPUS_ENV, CLUSTER_ADDRESS_ENV); on one machine neither is set and nothing changes.
"""

from __future__ import annotations

import os
from dataclasses import replace

from harness.runtime.serving_engine import LaunchPlan

NODE_GPUS_ENV = "QUANTGATE_NODE_GPUS"  # the GPUs of the cluster's largest node
CLUSTER_ADDRESS_ENV = "QUANTGATE_RAY_CLUSTER"  # the cluster's GCS address, HOST:PORT
DISTRIBUTED_BACKEND = ("--distributed-executor-backend", "ray")


def spans_nodes(tensor: int, pipeline: int, node_gpus: int | None) -> bool:
    """More GPUs than the largest node has (a cluster without GPUs spans nothing)."""
    return bool(node_gpus) and tensor * pipeline > node_gpus


def task_cluster() -> tuple[int | None, str | None]:
    """(GPUs of the largest node, cluster address) as the Ray executor set them for this chain; (None, None) on one
    machine."""
    gpus = os.environ.get(NODE_GPUS_ENV)
    return (int(gpus) if gpus and gpus.isdigit() else None), (os.environ.get(CLUSTER_ADDRESS_ENV) or None)


def across_nodes(plan: LaunchPlan, parallel: tuple[int, int], node_gpus: int | None,
                 address: str | None) -> LaunchPlan:
    """The launch plan with vLLM's Ray executor where the format spans nodes; the plan unchanged otherwise."""
    if not spans_nodes(*parallel, node_gpus):
        return plan
    args = tuple(a for a in plan.args)
    if "--distributed-executor-backend" not in args:
        args += DISTRIBUTED_BACKEND
    env = dict(plan.env, **({"RAY_ADDRESS": address} if address else {}))
    return replace(plan, args=args, env=env)


def spanning_note(parallel: tuple[int, int], node_gpus: int) -> str:
    tensor, pipeline = parallel
    return (f"tensor x pipeline parallel size {tensor} x {pipeline} = {tensor * pipeline} GPUs exceeds the "
            f"{node_gpus} of one node: vLLM serves it across nodes with its Ray executor "
            "(--distributed-executor-backend ray)")
