"""The localizers' machinery, beside the algorithms (``graft/localizers/*.py``) that use it: the interface and its
result types (:mod:`.base`: ``Localizer``, ``Localization``), and the one engine of the learned localizers
(:mod:`.engine`, paper Eq. 3–4) with its strategies — relaxations (:mod:`.relaxations`), the optimizer of their
parameters (:mod:`.optimizers`), layouts (:mod:`.layouts`, :mod:`.candidates`, :mod:`.sharded`: dense,
candidate-restricted, FSDP2) — and its parts: θ_ft read in memory or from files (:mod:`.source`), θ_pre lent and
restored (:mod:`.lending`), activation checkpointing (:mod:`.checkpointing`), streamed top-k (:mod:`.topk`), the rows
of a step and a region's accuracy (:mod:`.batches`) and when a trajectory has fitted enough (:mod:`.fit`)."""
