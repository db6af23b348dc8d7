"""Tasks, loaders and k-shot sampling."""

from skillgraft.lazy import lazy_exports

# each name’s module is imported on first use (``import skillgraft.data.x`` runs no sibling)
_EXPORTS = {
    "Example": "skillgraft.data.loading",
    "load_hf_split": "skillgraft.data.loading",
    "load_split": "skillgraft.data.loading",
    "read_file": "skillgraft.data.loading",
    "resolve_data_dir": "skillgraft.data.loading",
    "FewShotData": "skillgraft.data.sampling",
    "eval_subset": "skillgraft.data.sampling",
    "load_kshot": "skillgraft.data.sampling",
    "sample_kshot": "skillgraft.data.sampling",
    "DataSpec": "skillgraft.data.spec",
    "UserDataSpec": "skillgraft.data.spec",
    "TASKS": "skillgraft.data.tasks",
    "Task": "skillgraft.data.tasks",
    "get_task": "skillgraft.data.tasks",
    "load_task_yaml": "skillgraft.data.tasks",
    "register_task": "skillgraft.data.tasks",
    "task_from_dict": "skillgraft.data.tasks",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["TASKS", "DataSpec", "UserDataSpec", "Example", "FewShotData", "eval_subset", "Task", "get_task",
           "load_hf_split", "load_kshot", "load_split", "load_task_yaml", "read_file", "register_task",
           "resolve_data_dir", "sample_kshot", "task_from_dict"]
