"""The auditor's specification: prose (README.md), the generated lifecycle
diagram (:mod:`spec.diagram`) and the conformance vectors (``conformance/``)."""
