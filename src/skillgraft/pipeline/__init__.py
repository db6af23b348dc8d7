"""The layer every runner is built from: the store of finished stages, setups, variants, the report writer."""

from skillgraft.lazy import lazy_exports

# each name’s module is imported on first use (``import skillgraft.pipeline.x`` runs no sibling)
_EXPORTS = {
    "RunDir": "skillgraft.pipeline.report",
    "aggregate": "skillgraft.pipeline.report",
    "md_table": "skillgraft.pipeline.report",
    "mean_std": "skillgraft.pipeline.report",
    "pct": "skillgraft.pipeline.report",
    "summary_rows": "skillgraft.pipeline.report",
    "write_csv": "skillgraft.pipeline.report",
    "Store": "skillgraft.pipeline.store",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["RunDir", "Store", "aggregate", "md_table", "mean_std", "pct", "summary_rows", "write_csv"]
