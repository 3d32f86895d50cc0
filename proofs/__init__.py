"""Z3 proofs of the core's invariants, bound to the code by a differential check.

Every obligation has the form ``premises => goal`` and is discharged by asking
Z3 whether ``premises and not goal`` is satisfiable: ``unsat`` is a proof,
``sat`` a counterexample. Before that, the premises alone must be satisfiable,
so that no proof holds vacuously.

How the proofs are tied to the code: the model (:mod:`proofs.model`) is written
once against a small vocabulary (:mod:`proofs.logic`) and read twice. As Z3
terms it is what the proofs are about; as Python values,
:mod:`proofs.differential` runs it beside the real :mod:`htmqc.core` on every
state of a small exhaustive domain (every event, refusals included) and fails
on the first disagreement. So a bug in the core shows as a disagreement, and
the proofs are about exactly what was compared with the code. See
``proofs/README.md``.

* :mod:`proofs.tracker` - the tracker invariant of ``spec/README.md`` §3 and the
  invariants exactly-once depends on (:data:`proofs.model.INVARIANTS`) are
  inductive: they hold initially and every transition keeps them. The lifecycle
  transitions are generated from :data:`htmqc.core.lifecycle.EDGES`.
* :mod:`proofs.epochs` - assignment epochs are fresh, so late events never
  touch a newer assignment.
* :mod:`proofs.arith` - the inclusive/exclusive offset mapping, the backoff
  bound and the flow window.
* :mod:`proofs.differential` - the model against the code.
* Mutants (deliberately wrong transitions) are part of the run: each must
  produce a counterexample, or the proofs would not be able to see that bug.

Run ``python -m proofs``; the report goes to ``build/proofs/report.json``.
"""
