"""The verbs: each ``skillgraft <verb>`` is one function here, typed specs in, a typed result out; cli/ only parses
the options and prints the result, and recipes may call them.

    finetune  :func:`skillgraft.verbs.finetune.finetune`    → FinetuneResult (run directory, metrics)
    graft     :func:`skillgraft.verbs.graft.graft`          → GraftResult (report folder, typed GraftReport, rows)
    sweep     :func:`skillgraft.verbs.sweep.sweep`          → SweepResult
    merge     :func:`skillgraft.verbs.merge.run_merge`      → MergeResult (folder, typed MergeRows, merge.json)
    inspect   :func:`skillgraft.verbs.inspect.inspect`      → InspectResult
    apply     :func:`skillgraft.verbs.apply.apply`          → ApplyResult
    export    :func:`skillgraft.verbs.export.export`        → ExportResult (exporter, coordinates, its summary)
    fim       :func:`skillgraft.verbs.fim.fim`              → FimResult
    evaluate  :func:`skillgraft.verbs.evaluate.evaluate`    → EvaluateResult
    continual :func:`skillgraft.verbs.continual.continual_add` → ContinualResult (the task's typed state entry)

Every result subclasses :class:`skillgraft.verbs.result.VerbResult`: typed fields the command line prints from and
``document()``, what ``--json`` prints. Modules are imported on use (a verb loads only what it needs).
"""

import functools


def converts_into_store(fn):
    """Decorator of a verb taking ``cache=`` (a store folder) or ``store=`` (a :class:`Store`): GGUF files it
    converts go into that store too (:func:`skillgraft.models.gguf.in_store`), not into ``$SKILLGRAFT_CACHE``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from skillgraft.models.gguf import in_store  # noqa: PLC0415

        store = kwargs.get("store")
        with in_store(store.root if store is not None else kwargs.get("cache")):
            return fn(*args, **kwargs)

    return wrapper
