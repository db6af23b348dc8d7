"""Regions, grafts, localizers (learned and baselines), apply/revert and the graft file format."""

from skillgraft.graft.baselines import bias_region, movement, random_region, region_universe, size_from, top_movement
from skillgraft.graft.graft import Graft
from skillgraft.models.anatomy import carried_names, check_compatible, fingerprint, graftable_names
from skillgraft.graft.localize import LocalizeConfig, LocalizeResult, localize, top_k_masks
from skillgraft.graft.region import Region, module_type

__all__ = ["Graft", "LocalizeConfig", "LocalizeResult", "Region", "bias_region", "carried_names", "check_compatible",
           "fingerprint", "graftable_names", "localize", "module_type", "movement", "random_region",
           "region_universe", "size_from", "top_k_masks", "top_movement"]
