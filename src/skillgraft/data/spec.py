"""DataSpec: which examples a run sees — task, k-shot draw, data root, evaluation subset."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from skillgraft.spec import Spec


class DataSpec(Spec):
    """A k-shot draw of a registered task (LM-BFF sampling) and the test subset it is evaluated on."""

    task: str = Field("SST-2", description="task name (see `skillgraft tasks`)")
    k: int = Field(64, ge=1, description="examples per label (k-shot; the paper's main tables use 64); dev = the "
                                       "next k per label")
    seed: int = Field(42, description="data seed (LM-BFF: 13, 21, 42, 87, 100)")
    data_dir: Path | None = Field(None, description="data root (default: $SKILLGRAFT_DATA, ./data, ../shared/data)")
    test_limit: int | None = Field(None, ge=1, description="evaluate on a fixed seeded sample of N test examples")

    def load(self, task=None):
        """The :class:`~skillgraft.data.sampling.FewShotData` of this draw (test subset applied).

        ``task``: a Task object to use instead of looking ``self.task`` up in the registry (e.g. the task
        a saved model records).
        """
        from skillgraft.data.sampling import load_kshot  # noqa: PLC0415

        return load_kshot(task or self.task, self.k, self.seed, self.data_dir, test_limit=self.test_limit)
