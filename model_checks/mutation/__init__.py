"""Mutation testing: how much of the core can change before a check notices.

Two measures, one command (``python -m model_checks.mutation``):

``run`` (``make mutate``)
    Cosmic Ray's mutation operators generate every one-token change of
    ``src/htmqc/core`` (:mod:`~model_checks.mutation.mutants`); each mutant is
    written into a scratch copy of the package that the checks import first
    (:mod:`~model_checks.mutation.shadow`) and runs the fast deterministic
    checks of :mod:`~model_checks.mutation.config`, cheapest first, until one
    fails (:mod:`~model_checks.mutation.kill`). A survivor must be listed,
    with a reason, in ``equivalent.toml`` (:mod:`~model_checks.mutation.equivalent`),
    or the run exits 1.

``catalogue``
    Named one-line semantic bugs (:mod:`~model_checks.mutation.catalogue`),
    each run against every verification layer separately, to show which layer
    catches what (:mod:`~model_checks.mutation.catalogue_run`); exits 1 if a
    bug is caught by none.

Both write JSON to ``build/mutation/`` and a generated section at the end of
``spec/README.md`` (:mod:`~model_checks.mutation.report`); ``readme --check``
says whether those sections are current.
"""
