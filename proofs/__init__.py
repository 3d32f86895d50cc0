"""Z3 proofs of the core's invariants, over unbounded integers.

Every obligation has the form ``premises => goal`` and is discharged by asking
Z3 whether ``premises and not goal`` is satisfiable: ``unsat`` is a proof,
``sat`` a counterexample. Before that, the premises alone must be satisfiable,
so that no proof holds vacuously.

* :mod:`proofs.tracker` - the tracker invariant (``tracker_invariant`` in
  :mod:`htmqc.core.partition`) is inductive: it holds initially and every
  transition keeps it. The lifecycle transitions are generated from
  :data:`htmqc.core.lifecycle.EDGES`, so a new edge cannot go unproved.
* :mod:`proofs.epochs` - assignment epochs are fresh, so late events never
  touch a newer assignment.
* :mod:`proofs.arith` - the inclusive/exclusive offset mapping and the backoff
  bound.
* Mutants (deliberately wrong transitions) are part of the run: each must
  produce a counterexample, or the proofs would not be able to see that bug.

Run ``python -m proofs``; the report goes to ``build/proofs/report.json``.
"""
