"""The verbs: each ``skillgraft <verb>`` is one function here, typed specs in, a typed result out; cli/ only parses
the options and prints the result, and recipes may call them.

    finetune  :func:`skillgraft.verbs.finetune.finetune`    → FinetuneResult (run directory, metrics)
    graft     :func:`skillgraft.verbs.graft.graft`          → GraftResult (report folder, metrics, rows)
    sweep     :func:`skillgraft.verbs.sweep.sweep`          → SweepResult
    merge     :func:`skillgraft.verbs.merge.run_merge`      → MergeResult (folder, typed MergeRows, merge.json)
    inspect   :func:`skillgraft.verbs.inspect.inspect`      → InspectResult
    apply     :func:`skillgraft.verbs.apply.apply`          → ApplyResult
    export    :func:`skillgraft.verbs.export.export`        → ExportResult (exporter, coordinates, its summary)
    fim       :func:`skillgraft.verbs.fim.fim`              → FimResult
    evaluate  :func:`skillgraft.verbs.evaluate.evaluate`    → EvaluateResult
    continual :func:`skillgraft.verbs.continual.continual_add` → ContinualResult (the task's typed state entry)

Modules are imported on use (a verb loads only what it needs).
"""
