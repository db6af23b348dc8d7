"""Regions, budgets and the shared selection, the localizer registry, grafts, apply/revert and the graft file."""

from skillgraft.lazy import lazy_exports

# each name’s module is imported on first use (``import skillgraft.graft.x`` runs no sibling)
_EXPORTS = {
    "Graft": "skillgraft.graft.graft",
    "LOCALIZERS": "skillgraft.graft.localizers",
    "LocalizeConfig": "skillgraft.graft.localizers",
    "LocalizeResult": "skillgraft.graft.localizers",
    "Localizer": "skillgraft.graft.localizers",
    "get_localizer": "skillgraft.graft.localizers",
    "localize": "skillgraft.graft.localizers",
    "movement": "skillgraft.graft.localizers",
    "register_localizer": "skillgraft.graft.localizers",
    "Region": "skillgraft.graft.region",
    "module_type": "skillgraft.graft.region",
    "ROUND": "skillgraft.graft.selection",
    "Budget": "skillgraft.graft.selection",
    "parse_budgets": "skillgraft.graft.selection",
    "region_universe": "skillgraft.graft.selection",
    "select": "skillgraft.graft.selection",
    "top_k_masks": "skillgraft.graft.selection",
    "carried_names": "skillgraft.models.anatomy",
    "check_compatible": "skillgraft.models.anatomy",
    "fingerprint": "skillgraft.models.anatomy",
    "graftable_names": "skillgraft.models.anatomy",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["LOCALIZERS", "ROUND", "Budget", "Graft", "LocalizeConfig", "LocalizeResult", "Localizer", "Region",
           "carried_names", "check_compatible", "fingerprint", "get_localizer", "graftable_names", "localize",
           "module_type", "movement", "parse_budgets", "region_universe", "register_localizer", "select",
           "top_k_masks"]
