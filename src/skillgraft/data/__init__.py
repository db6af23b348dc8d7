"""Tasks, loaders and k-shot sampling."""

from skillgraft.data.loading import Example, load_hf_split, load_split, read_file, resolve_data_dir
from skillgraft.data.sampling import FewShotData, eval_subset, load_kshot, sample_kshot
from skillgraft.data.spec import DataSpec, UserDataSpec
from skillgraft.data.tasks import TASKS, Task, get_task, load_task_yaml, register_task, task_from_dict

__all__ = ["TASKS", "DataSpec", "UserDataSpec", "Example", "FewShotData", "eval_subset", "Task", "get_task", "load_hf_split", "load_kshot", "load_split",
           "load_task_yaml", "read_file", "register_task", "resolve_data_dir", "sample_kshot", "task_from_dict"]
