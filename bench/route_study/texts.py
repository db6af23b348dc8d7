"""The study's rows as texts (texts.json), for the n-gram routers."""
import json

from common import STUDY, TASKS, join, row_sets

sets = row_sets()
json.dump({s: [join(r) for t in TASKS for r in by[t]] for s, by in sets.items()}, open(STUDY + "/texts.json", "w"))
