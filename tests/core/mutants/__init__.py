"""One-line bugs in the real core that the verification layers must reject
(:mod:`.table`), and the tools that show they do (:mod:`.measure`, :mod:`.no_shrink`)."""
