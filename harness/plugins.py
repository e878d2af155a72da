"""Formats and metrics from outside quantgate: QUANTGATE_PLUGINS=module[,module...] names modules that call
harness.formats.register and harness.metrics.register_metric at import. The command line and every worker
import them (workers inherit the environment), so a plugin format quantizes and evaluates like a built-in one."""

from __future__ import annotations

import importlib
import os

from harness.errors import UserError

PLUGINS_ENV = "QUANTGATE_PLUGINS"


def load_plugins(environ=os.environ) -> list[str]:
    names = [n.strip() for n in environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise UserError(f"{PLUGINS_ENV}: cannot import plugin module '{name}' ({exc}); put it on PYTHONPATH "
                            "or remove it from the variable") from None
    return names
