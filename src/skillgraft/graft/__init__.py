"""Regions, budgets and the shared selection, the localizer registry, grafts, apply/revert and the graft file."""

from skillgraft.graft.graft import Graft
from skillgraft.graft.localizers import (LOCALIZERS, LocalizeConfig, LocalizeResult, Localizer, get_localizer,
                                         localize, movement, register_localizer)
from skillgraft.graft.region import Region, module_type
from skillgraft.graft.selection import ROUND, Budget, parse_budgets, region_universe, select, top_k_masks
from skillgraft.models.anatomy import carried_names, check_compatible, fingerprint, graftable_names

__all__ = ["LOCALIZERS", "ROUND", "Budget", "Graft", "LocalizeConfig", "LocalizeResult", "Localizer", "Region",
           "carried_names", "check_compatible", "fingerprint", "get_localizer", "graftable_names", "localize",
           "module_type", "movement", "parse_budgets", "region_universe", "register_localizer", "select",
           "top_k_masks"]
