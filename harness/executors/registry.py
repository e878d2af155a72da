"""The executors by name (--executor): a new one (Kubernetes Jobs, Slurm) is one module and one line here. Each
entry is "module:Class", imported only when chosen, so that the local default needs nothing extra installed."""

from __future__ import annotations

import importlib

# config.py validates --executor against EXECUTORS: this module imports no other of harness (base.py, the
# interface, imports the run's records, which import config.py).

EXECUTORS = {
    "local": "harness.executors.local:LocalExecutor",
    "ray": "harness.executors.ray:RayExecutor",
}


def executor_class(name: str) -> "type[harness.executors.base.Executor]":
    module, _, cls = EXECUTORS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def check_executor(spec) -> None:
    """Before any work: the requirements of the executor `spec` (RunSpec) names (an installed extra, a reachable
    cluster), each as one readable line (UserError): its module's check(spec), where it has one."""
    check = getattr(importlib.import_module(EXECUTORS[spec.executor].partition(":")[0]), "check", None)
    if check is not None:
        check(spec)


def executor_for(inputs, chain) -> "harness.executors.base.Executor":
    """The executor the run's --executor names, for `inputs` (RunInputs), running `chain` (base.Chain)."""
    return executor_class(inputs.spec.executor)(inputs, chain)
