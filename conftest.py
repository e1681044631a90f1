"""pytest set-up shared by every package's tests: the order in which test modules start.

When a nox session runs a package's tests in two processes (pytest-xdist ``--dist loadfile``
with ``--no-loadscope-reorder``, see ``PARALLEL_TEST_ARGS`` in the noxfile), each process
takes the next whole module in collection order as it runs short of work. A long module
taken last leaves the other process idle while it runs, so the longest modules are moved to
the front of the collection (longest first); the rest keep pytest's order. A module missing
from the list only costs balance, never a test. Run alone (one process), the order changes
nothing but which module runs first.
"""

from __future__ import annotations

import pytest

#: the test modules that take longest, longest first within each package (seconds of one
#: pytest process while both run, measured on the 2-core machine on 2026-12-06; file names
#: are unique across the repository). docs/guides/contributing.md says how to measure them.
LONGEST_FIRST = (
    # integration
    "test_integration_doc_examples.py",  # 183
    "test_integration_reattach.py",  # 66 to 104
    "test_integration_examples.py",  # 54
    "test_integration_cluster_auth.py",  # 56
    "test_integration_router_builtin.py",  # 26 to 43
    # sc-trainer
    "test_trainer_fault_matrix.py",  # 113
    "test_trainer_ray.py",  # 101
    "test_trainer_exact_mode.py",  # 59
    "test_trainer_hf_model.py",  # 58
    "test_trainer_agent_trainer.py",  # 56
    "test_trainer_server_rollout.py",  # 50
    "test_trainer_multinode.py",  # 35
    "test_trainer_async.py",  # 34
    "test_trainer_learning.py",  # 31
    # sc-ray
    "test_ray_worker_group.py",  # 76
    "test_ray_edges.py",  # 74
    "test_ray_runs.py",  # 67
    "test_ray_replace.py",  # 47
    "test_ray_verl_parity.py",  # 43
    "test_ray_data_path.py",  # 41
    "test_ray_node_loss.py",  # 41
    "test_ray_colocation.py",  # 35
    # sc-workers
    "test_workers_checkpoint_reshard.py",  # 81
    "test_workers_pipeline.py",  # 49
    "test_workers_pipeline_hf.py",  # 44
    "test_workers_sync_gloo.py",  # 42
    "test_workers_hf.py",  # 34
    "test_workers_collective_abort.py",  # 31
)
_RANK = {name: rank for rank, name in enumerate(LONGEST_FIRST)}


def module_rank(item: pytest.Item) -> int:
    """Where ``item``'s module starts: its place in LONGEST_FIRST, or after all of them."""
    return _RANK.get(item.path.name, len(LONGEST_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A stable sort on the module alone: the tests of a module stay together and in order.
    items.sort(key=module_rank)
