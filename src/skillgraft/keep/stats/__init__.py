"""The keep search's statistics (issue 79: a low floor): lower confidence bounds of a graft's share of FT's score
(:mod:`.bound`: exact, paired, bootstrap and betting), the paired test's exact null tail (:mod:`.paired_exact`) and
label-free agreement with FT (:mod:`.agreement`). NumPy and SciPy only: of skillgraft, ``errors`` and ``lazy`` (NumPy
imported at first use), two root modules that import nothing of skillgraft."""
