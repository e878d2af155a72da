"""The suite's own xdist scheduler (tests/conftest.py) overrides LoadScopeScheduling._split_scope, a private
method: this fails loudly when pytest-xdist stops forming its work units through it."""

import inspect

from conftest import DEMO_RUN_FILES, demo_run_scope


def test_xdist_still_forms_work_units_through_split_scope():
    from xdist.scheduler import LoadScopeScheduling

    assert "_split_scope" in vars(LoadScopeScheduling)
    assert "self._split_scope(" in inspect.getsource(LoadScopeScheduling)


def test_the_demo_run_files_form_their_groups_and_nothing_else_does():
    from harness.runtime.device import cpu_has_bf16_matmul

    assert demo_run_scope("tests/test_pipeline_e2e.py::test_every_format_of_the_demo_recipe_runs") == "demo-run"
    assert demo_run_scope("tests/test_vllm_served_run.py::test_served_run_scores_through_vllm") == "demo-run"
    no_bf16 = demo_run_scope(f"tests/{DEMO_RUN_FILES['demo-run-no-bf16'][0]}::test_x")
    assert no_bf16 == ("demo-run-no-bf16" if cpu_has_bf16_matmul() else "demo-run")
    assert demo_run_scope("tests/test_units.py::test_is_number") is None
